"""Reusable inputs and panels: the sidebar, the skip-set badge and editor, pickers."""
from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from dashboard.session import state
from dashboard.session.links import SOURCE_KEYS
from dashboard.session.resources import (
    load_log,
    loading,
    locked,
    memory_in_use,
    started,
    unload_models,
)
from pop_analysis.data.allowed_paths import check_model
from pop_analysis.engine.embedded import REGISTRY
from pop_analysis.store.paths import cache_dir

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

# radio label -> a registry name (an embedded model) or "hub" / "local"
SOURCES = {label: key for key, label in SOURCE_KEYS.items()}
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_ERRORS = (ValueError, OSError, RuntimeError)  # ModelLoadError is a RuntimeError


# ---------- numbers ----------

REFUSED = "lab.refused_inputs"  # labels of the numbers refused in this script run


def number(where, label: str, low, high, key: str, **kw):
    """A number box that refuses an out-of-range value where it is typed: the value is kept as
    typed (no silent return to the last valid one), a one-line error stands under the box, and
    `refused()` is true for the rest of the run, so the page's Run button is disabled."""
    if isinstance(low, int) and isinstance(high, int):
        kw.setdefault("step", 1)  # whole numbers (without bounds the box would hold floats)
    value = where.number_input(label, key=key, **kw)  # no min/max: the browser would keep the old
    if value is None or not low <= value <= high:
        got = "nothing" if value is None else f"{value:g}"
        where.error(f"{label} must lie in {low:g}..{high:g}; got {got}. Nothing runs until it does.")
        st.session_state.setdefault(REFUSED, []).append(label)
    return value


def heal_controls(policy_col, budget_col, prefix: str, budget_default: int, budget_max: int,
                  disabled: bool = False) -> tuple[str, float | None]:
    """Healing's policy and positions per step (keys `<prefix>.heal`, `<prefix>.heal_budget`)."""
    from pop_vllm.healing import POLICIES

    policy = policy_col.radio("Healing (after the first token)", POLICIES, horizontal=True,
                              key=state.kept(f"{prefix}.heal", "none"), disabled=disabled,
                              help="POP then re-runs the layers from the first skipped one up "
                                   "over the prompt between decode steps, so its cache becomes "
                                   "the full model's (docs/healing.md)")
    budget = number(budget_col, "Positions per step", 2, budget_max,
                    key=state.kept(f"{prefix}.heal_budget", budget_default),
                    disabled=disabled or policy != "budget")
    return policy, budget


def heal_label(policy: str, budget) -> str:
    """'none', 'eager' or 'budget 16 per step': healing as a result's settings name it."""
    return policy + (f" {int(budget)} per step" if policy == "budget" and budget is not None else "")


def refused() -> bool:
    """Whether a number on this page was refused in this run."""
    return bool(st.session_state.get(REFUSED))


def start_run() -> None:
    """Every script run starts with no refused number (app.py, before the page)."""
    st.session_state[REFUSED] = []


# ---------- tables ----------

def rounded(value, digits: int = 4):
    """Floats to `digits` significant digits, through lists, dicts and data frames: a table reads
    1.234, not 1.2340594137714023."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if value == value else value
    if isinstance(value, (list, tuple)):
        return type(value)(rounded(v, digits) for v in value)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if hasattr(value, "map") and hasattr(value, "columns"):  # a pandas DataFrame
        return value.map(lambda v: rounded(v, digits))
    return value


def table(data, where=None, **kw) -> None:
    """st.dataframe of `data` with its floats rounded (see rounded)."""
    (where or st).dataframe(rounded(data), **kw)


# ---------- model ----------

def _devices() -> list[str]:
    """auto and cpu, and cuda once torch (imported by the model's load) sees one: the first page
    must not wait for torch to import."""
    import sys

    cuda = "torch" in sys.modules and sys.modules["torch"].cuda.is_available()
    return ["auto", "cpu"] + (["cuda"] if cuda or st.session_state.get("w.device") == "cuda" else [])


def _spec_from_form(source: str, name: str, device: str, dtype: str) -> state.ModelSpec:
    embedded = SOURCES[source] in REGISTRY
    name = SOURCES[source] if embedded else name.strip()
    if not name:
        raise ValueError("give a hub id (owner/name) or a local directory")
    if not embedded:
        check_model(name)  # outside the allowed folders: refused unread (a hub id resolves in cwd)
    return state.ModelSpec(name, None if device == "auto" else device, None if dtype == "auto" else dtype)


def _on_choice() -> None:
    """An embedded model, a device or a dtype acts at once (the model loads in the background)."""
    ss = st.session_state
    if SOURCES[ss["w.model_source"]] not in REGISTRY:
        return  # a hub id or a folder waits for its name and "Load model"
    ss.pop(state.LINK_ERROR, None)
    state.set_model_spec(_spec_from_form(ss["w.model_source"], "", ss["w.device"], ss["w.dtype"]))
    ss[state.UNLOADED] = False


def model_form() -> None:
    """Sidebar: model source, device, dtype (each acts when changed); a hub id or a local
    directory is typed, then loaded with its button. Errors are shown here, once."""
    side = st.sidebar
    source = side.radio("Model", list(SOURCES), key="w.model_source", on_change=_on_choice)
    c1, c2 = side.columns(2)
    device = c1.selectbox("Device", _devices(), key="w.device", on_change=_on_choice)
    dtype = c2.selectbox("dtype", DTYPES, key="w.dtype", on_change=_on_choice)
    refused = st.session_state.get(state.LINK_ERROR)
    if refused:
        side.error(refused)
    if SOURCES[source] in REGISTRY:
        if st.session_state.get(state.UNLOADED):
            side.button("Load model", key="w.load", on_click=_on_choice, width="stretch")
        return
    with side.form("model_form", border=False):
        name = st.text_input("Hub id or directory", key="w.model_name",
                             placeholder="Qwen/Qwen3-0.6B or /path/to/model")
        submitted = st.form_submit_button("Load model", width="stretch")
    if submitted:  # a typed model is loaded before it replaces the current one
        st.session_state.pop(state.LINK_ERROR, None)
        try:
            spec = _spec_from_form(source, name, device, dtype)
            loading.clear(*spec.key)  # a failed load of the same spec is tried again
            with side, st.spinner(f"Loading {spec.name} ..."):
                loading(*spec.key).wait()
        except LOAD_ERRORS as e:
            side.error(f"Model not loaded: {e}")
            return
        state.set_model_spec(spec)
        st.session_state[state.UNLOADED] = False


def current_model(say_why: bool = True):
    """The shared model of the session's spec, or None: unloaded, failed (the reason shown in
    the sidebar unless `say_why` is off: app.py says it once a run), not asked for yet or still
    loading (the sidebar's panel says so). Never starts a load: the page does (model_or_stop),
    once it has drawn what needs no model."""
    if st.session_state.get(state.UNLOADED):
        return None
    lo = started(*state.model_spec().key)
    if lo is None or not lo.ready:
        return None
    try:
        return lo.wait()
    except LOAD_ERRORS as e:
        if say_why:
            st.sidebar.error(f"Model not loaded: {e}")
        return None


def model_panel(lm: LoadedModel) -> None:
    """Facts about the loaded model, memory in use, and the unload button."""
    side = st.sidebar
    if lm is None:
        lo = started(*state.model_spec().key)
        if st.session_state.get(state.UNLOADED):
            side.info("No model loaded. Choose one above.")
        elif lo is None or not lo.ready:  # a failed load has said why above
            side.info(f"Loading **{state.model_spec().name}** in the background ... The pages "
                      "show stored examples meanwhile.")
        return
    card = lm.card()
    loads = len(load_log())
    side.caption(f"**{card['name']}** · {card['layers']} layers · {card['device']} · {card['dtype']} · "
                 f"loaded in {lm.load_seconds:.1f} s · loads in this server: {loads}")
    mem = memory_in_use()
    text = f"Memory in use: {mem['process_rss_mib']:.0f} MiB (process)"
    if "cuda_allocated_mib" in mem:
        text += f", {mem['cuda_allocated_mib']:.0f} MiB on the GPU"
    side.caption(text)
    if side.button("Unload model", key="w.unload", help="free the memory (all sessions)"):
        unload_models()
        st.session_state[state.UNLOADED] = True
        st.rerun()


def model_or_stop():
    """For pages: the shared model (waiting for a load under way, then drawing the page again
    so the sidebar shows it), or a note and stop when none is loaded."""
    lm = current_model(say_why=False)  # the sidebar has said why already
    if lm is None and not st.session_state.get(state.UNLOADED):
        key = state.model_spec().key
        lo = started(*key)
        if lo is None or not lo.ready:  # the sidebar drew this run without the model's outcome
            lo = loading(*key)
            with st.spinner(f"Loading {lo.name} in the background ..."):
                lo.thread.join()
            st.rerun()
    if lm is None:
        st.info("No model is loaded. Choose one in the sidebar to use this page.")
        st.stop()
    return lm


def raw_box(where, lm: LoadedModel, key: str) -> bool:
    """The "Raw (no chat template)" box; ticked and fixed for a model without a chat template
    (a base model such as Gemma-3-270M), whose prompts always go in as written."""
    if getattr(lm.tokenizer, "chat_template", None):
        return where.checkbox("Raw (no chat template)", key=state.kept(key, False))
    where.checkbox("Raw (no chat template)", value=True, disabled=True, key=f"{key}.fixed",
                   help=f"{lm.name} has no chat template: prompts go in as written")
    return True


def run_lock():
    """The shared model's run lock (one run at a time across sessions)."""
    return locked(*state.model_spec().key,
                  on_wait=lambda: st.toast("Another session is using the model; waiting ..."))


# ---------- skip set ----------

SKIP_BOX = "w.skip"  # the sidebar's skip-set box (synced from state.SKIP every run)
SKIP_ERROR = "lab.skip_error"  # the sidebar box's last rejected input, shown under it


def _on_skip_box(n: int) -> None:
    from dashboard.session.links import parse_skip
    from pop_vllm.run_setting import SettingError

    try:
        state.set_skip(parse_skip(st.session_state[SKIP_BOX]), n)
        st.session_state.pop(SKIP_ERROR, None)
    except SettingError as e:
        st.session_state[SKIP_ERROR] = str(e)


def skip_badge(lm: LoadedModel, where=None) -> None:
    """The current skip set, always visible and editable: layers, share, ideal speedup, a
    mini strip, and a box that takes '20-29', '3,5,7' or 'none'."""
    from dashboard.session.links import skip_text
    from pop_analysis.engine.skipset import describe
    from pop_analysis.speed.flops import ideal_speedup
    from pop_vllm.run_setting import RunSetting

    where = where or st.sidebar
    n = lm.adapter.n_layers
    from dashboard.panels import precision_controls
    from dashboard.session.precision_state import int8_for

    skip = state.skip_for(n)
    int8 = int8_for(n, skip)
    ideal = ideal_speedup(lm.adapter.shape, 512, RunSetting(skip))
    colour = {**{i: precision_controls.INT8_COLOUR for i in int8}, **{i: "#f3b37a" for i in skip}}
    cells = "".join(
        f'<span title="layer {i}" style="display:inline-block;width:{max(2, 180 // n)}px;height:12px;'
        f'margin-right:1px;background:{colour.get(i, "#cfe3f5")}"></span>'
        for i in range(n))
    where.markdown(f"**Skip set:** {html.escape(describe(skip))} "
                   f"({len(skip)}/{n} layers) · ideal prefill speedup {ideal:.2f}× at 512 tokens")
    where.markdown(f'<div data-testid="pop-skip-strip">{cells}</div>', unsafe_allow_html=True)
    state.sync(SKIP_BOX, skip_text(skip))
    where.text_input("Skip layers", key=SKIP_BOX, on_change=_on_skip_box, args=(n,),
                     help=f"layers 0..{n - 1} POP skips in prefill: '20-29', '3,5,7-9' or 'none'; "
                          "shared with every page")
    err = st.session_state.pop(SKIP_ERROR, None)
    if err:
        where.error(f"Skip set unchanged: {err}")
    precision_controls.sidebar_box(lm, skip, where)


# ---------- data sets ----------

def dataset_picker(prefix: str):
    """Built-in, uploaded file, local path or HF data set -> (source, field, label) or None.
    The choices survive page changes (kept inputs); so does the last uploaded file."""
    kind = st.radio("Prompts", ("built-in", "upload a file", "local path", "Hugging Face data set"),
                    horizontal=True, key=state.kept(f"{prefix}.kind", "built-in"))
    if kind == "built-in":
        return "builtin", None, "built-in prompts"
    if kind == "upload a file":
        up = st.file_uploader("File (.jsonl, .json, .csv, .parquet, .txt)",
                              type=["jsonl", "json", "csv", "parquet", "txt"], key=f"{prefix}.upload")
        last = state.KEEP + f"{prefix}.upload"
        if up is not None:
            try:
                st.session_state[last] = (save_upload(up.name, up.getvalue()), up.name)
            except OSError as e:  # errors name the user's file, never the cache path
                st.error(f"Cannot keep the upload {up.name}: {e.strerror or 'write failed'}")
                return None
        if last not in st.session_state:
            return None
        path, name = st.session_state[last]
        if up is None:
            st.caption(f"Using the file uploaded earlier: {name} (upload another to replace it).")
        return path, field_picker(path, prefix), name
    if kind == "local path":
        path = st.text_input("Path of a local file", key=state.kept(f"{prefix}.path", ""),
                             placeholder="/data/prompts.jsonl")
        if not path.strip():
            return None
        return path.strip(), field_picker(path.strip(), prefix), Path(path).name
    name = st.text_input("Data set (NAME[:split])", key=state.kept(f"{prefix}.hf", ""),
                         placeholder="gsm8k:test")
    field = st.text_input("Field (empty = guess)", key=state.kept(f"{prefix}.hf_field", "")) or None
    return (f"hf:{name.strip()}", field, name.strip()) if name.strip() else None


def field_picker(path: str, prefix: str) -> str | None:
    from dashboard.session.cached import peek_fields

    fields = peek_fields(path)
    if not fields:
        return None
    options = ["(guess)"] + fields
    key = f"{prefix}.field"
    if state.value(key) not in options:  # a choice made for another file
        st.session_state.pop(key, None)
        st.session_state.pop(state.KEEP + key, None)
    choice = st.selectbox("Field holding the prompt", options, key=state.kept(key, "(guess)"))
    return None if choice == "(guess)" else choice


def save_upload(name: str, data: bytes) -> str:
    """Keep an uploaded file as cache/uploads/<content hash>/<its own name> and return the path
    (the folder keeps equal names apart; the name is what errors and results show)."""
    own = Path(re.sub(r"[^\w.\- ]", "_", Path(name).name).lstrip(". ") or "upload")
    safe = own.stem[:80] + own.suffix[:10]
    path = cache_dir() / "uploads" / hashlib.sha256(data).hexdigest()[:16] / safe
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(path)


# ---------- results: where they came from ----------

def _short(v, width: int = 60) -> str:
    text = " ".join(str(v).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def made_from(key: str, now: dict | None = None, action: str = "Run") -> None:
    """Under a result: the settings it came from and, when the inputs on screen differ, a stale
    note naming what changed and the button that updates it. A stored example says what it is
    (model, data, machine, date) and that the user's own run replaces it."""
    ctx = state.context_of(key)
    if "example" in ctx:
        st.info(f"**{ctx['example']}**. Press **{action}** for your own run: it replaces this "
                f"example. Made by `{ctx.get('command', '')}`.", icon=":material/school:")
        return
    if ctx:
        st.caption("Made from: " + " · ".join(f"{k} {_short(v)}" for k, v in ctx.items()
                                               if k != "partial"))
    if ctx.get("partial"):
        st.warning(f"Partial result: {ctx['partial']}")
    diff = state.changed(key, now or {})
    if diff:
        st.warning(f"Stale: the {', '.join(diff)} changed since this result was made; press "
                   f"**{action}** to update it.", icon=":material/history:")
