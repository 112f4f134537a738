"""The Methods page's run form (which methods, which prompts, how many) and its stored runs."""
from __future__ import annotations

import datetime

import streamlit as st

from dashboard.panels import widgets
from dashboard.session import cached, jobs, state
from pop_analysis.data.prompts import DatasetError
from pop_analysis.engine.models import LoadedModel
from pop_analysis.errors import first_line
from pop_analysis.experiments import methods_run as mr
from pop_analysis.importance.methods import METHODS
from pop_analysis.progress import duration

JOB = "importance"


def form(lm: LoadedModel) -> None:
    """Methods to run, prompts, sizes; the run goes to a background job (cancellable)."""
    with st.container(border=True):
        picked = widgets.dataset_picker("imp")
        c = st.columns([3, 1, 1, 1])
        methods = c[0].multiselect("Methods", list(METHODS), format_func=lambda m: METHODS[m].title,
                                   key=state.kept("imp.methods", list(METHODS)),
                                   help="drop-one is the expensive one: a forward per layer")
        n = widgets.number(c[1], "Prompts", 1, 1000, key=state.kept("imp.n", 8),
                              help="the same prompts for every method")
        tokens = widgets.number(c[2], "New tokens", 1, 256, key=state.kept("imp.tokens", 16),
                                   help="gate: sampled response bound; drop-one: continuation scored")
        use_cache = c[3].checkbox("Use stored results", key=state.kept("imp.cache", True))
        raw = widgets.raw_box(st, lm, "imp.raw")
        now = {"model": lm.name, "data": picked[2] if picked else None, "methods": ", ".join(methods),
               "prompts": int(n), "new tokens": int(tokens)}
        go = st.button("Rank the layers", type="primary", key="imp.go",
                       disabled=picked is None or jobs.running(JOB) or widgets.refused())
        if go and picked is not None:
            fields = {"methods": tuple(m for m in METHODS if m in methods), "n_samples": int(n),
                      "new_tokens": int(tokens), "raw": raw}
            _start(lm, picked, fields, use_cache, now)
        jobs.panel(JOB)


def _start(lm: LoadedModel, picked, fields: dict, use_cache, now) -> None:
    """fields: the form's ImportanceConfig fields (checked here, so a bad one is one line)."""
    source, field, label = picked
    try:
        cfg = mr.ImportanceConfig(**fields)
        prompts = cached.prompt_set(source, field, cfg.n_samples)
    except DatasetError as e:
        st.error(f"Cannot read the prompts: {e}")
        return
    except ValueError as e:  # an empty method list, a bad size: one line where the user acted
        st.error(f"Cannot rank: {first_line(e)}")
        return
    jobs.start(JOB, f"Ranking layers on {label}",
               lambda progress: mr.cached_importance(lm, prompts, cfg, use_cache, progress,
                                                     progress.notice),
               lambda job: jobs.outcome(
                   job, state.IMPORTANCE, f"Importance on {label}",
                   "use fewer prompts or leave drop-one out.", lambda p: "part",
                   lambda r: f"{len(r.methods)} methods on {r.n_samples} prompts in "
                             f"{duration(sum(r.seconds.values()))}"), context=now)


def label(entry: dict) -> str:
    p = entry.get("params") or {}
    when = datetime.datetime.fromtimestamp(entry.get("saved_at", 0)).strftime("%Y-%m-%d %H:%M")
    methods = ", ".join((p.get("config") or {}).get("methods") or [])
    return f"{p.get('model', '?')} · {p.get('dataset', '?')} · {p.get('n_samples', '?')} prompts · {methods} · {when}"


def stored(lm: LoadedModel) -> None:
    """Reload a stored run of this model (the CLI's `importance` fills the same store)."""
    entries = [e for e in cached.stored_entries(mr.KIND)
               if (e.get("params") or {}).get("model") == lm.name]
    if not entries:
        return
    with st.expander(f"Stored runs of {lm.name} ({len(entries)})", expanded=False):
        labels = {e["key"]: label(e) for e in entries}
        a, b = st.columns([4, 1], vertical_alignment="bottom")
        key = a.selectbox("Run", list(labels), format_func=labels.get, key="imp.stored")
        if b.button("Load", key="imp.load"):
            res = mr.load_importance(key, lm.adapter.n_layers)
            if res is None:
                st.error("That entry is missing or unreadable; run it again.")
            else:
                state.keep_result(state.IMPORTANCE, res, {"stored": labels[key]})
