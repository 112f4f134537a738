"""The Methods page's comparison: POP with each method's set per budget on held-out items, one
frontier per method (the tail always drawn), the verdicts, and "use this set" for any point."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import methods as charts
from dashboard.panels import widgets
from dashboard.panels.methods_scores import _use, titles
from dashboard.session import jobs, state
from pop_analysis.engine.models import LoadedModel
from pop_analysis.errors import first_line
from pop_analysis.experiments import methods_compare as mc
from pop_analysis.experiments import methods_verdicts as mv
from pop_analysis.importance.picks import BUDGETS, SHAPES
from pop_analysis.progress import duration

JOB = "method_compare"


def form(lm: LoadedModel, res) -> None:
    with st.expander("Compare the methods' skip sets", expanded=jobs.running(JOB)
                     or st.session_state.get(state.METHOD_COMPARE) is None):
        c = st.columns(5)
        budgets = c[0].multiselect("Budgets (share of layers)", BUDGETS, format_func="{:.0%}".format,
                                   key=state.kept("cmp.budgets", list(BUDGETS)))
        shapes = c[1].multiselect("Shapes", SHAPES, key=state.kept("cmp.shapes", list(SHAPES)),
                                  help="block: one contiguous block; free: any layers")
        data = c[2].text_input("Held-out items", key=state.kept("cmp.data", "gsm8k"),
                               help="gsm8k (reference answers), wizardlm, a .jsonl path")
        n = widgets.number(c[3], "Items", 2, 1319, key=state.kept("cmp.n", 16))
        seeds = widgets.number(c[4], "Random draws", 0, 20, key=state.kept("cmp.seeds", 3))
        speed = st.checkbox("Time each set's prefill (the timing protocol)", key=state.kept("cmp.speed", False))
        now = {"importance": f"{res.dataset}, n = {res.n_samples}", "items": f"{data} × {int(n)}",
               "budgets": ", ".join(f"{b:.0%}" for b in budgets)}
        if st.button("Compare", type="primary", key="cmp.go", disabled=jobs.running(JOB) or widgets.refused()):
            try:
                cfg = mc.CompareConfig(budgets=tuple(sorted(budgets)), shapes=tuple(shapes),
                                       dataset=data.strip(), n_samples=int(n), random_seeds=int(seeds),
                                       speed=speed)
            except ValueError as e:
                st.error(f"Cannot compare: {first_line(e)}")
            else:
                jobs.start(JOB, "Comparing the methods' skip sets",
                           lambda progress: mc.cached_comparison(lm, res, cfg, True, progress,
                                                                 progress.notice),
                           lambda job: jobs.outcome(
                               job, state.METHOD_COMPARE, "Comparison", "use fewer items.",
                               lambda p: "part", lambda r: f"{len(r.rows)} sets on {r.n} items in "
                                                           f"{duration(r.seconds)}"), context=now)
        jobs.panel(JOB)


@st.cache_data(show_spinner=False, max_entries=4)
def _verdicts(rows: list[dict], item_nll: dict) -> list[dict]:
    return mv.verdicts(rows, mc.paired_from(item_nll))


def _ties(verdicts: list[dict]) -> str:
    """One line: where the tail's set wins alone, where methods tie on the identical set."""
    c = mv.counts(verdicts)
    merged = mv.merged_budgets(verdicts)
    return (f"Ties are ties: of {c['cells']} cells the tail's set is best alone in "
            f"{len(c['tail_alone'])}, shares the best set with other methods in "
            f"{len(c['tail_tied'])}, and another method's set is best in {len(c['other'])}."
            + (f" One cell per k: {'; '.join(merged)}." if merged else ""))


def show(lm: LoadedModel, res) -> dict:
    """Verdicts, frontiers and the "use this set" picker of the last comparison; its figures."""
    cmp = st.session_state.get(state.METHOD_COMPARE)
    if cmp is None:
        return {}
    n = lm.adapter.n_layers
    names = titles(res)
    st.subheader(f"Which method picks the best prefill skip set ({cmp.n} held-out items)")
    verdicts = cmp.verdicts if all("best_methods" in v for v in cmp.verdicts) \
        else _verdicts(cmp.rows, cmp.item_nll)  # a comparison stored before ties were named
    for v in verdicts:
        st.markdown(f"- {v['line']}")
    st.caption(_ties(verdicts))
    figs = {}
    for col, shape in zip(st.columns(len(cmp.config["shapes"])), cmp.config["shapes"]):
        figs[f"frontier_{shape}"] = charts.frontier_chart(cmp.rows, shape, names)
        col.plotly_chart(figs[f"frontier_{shape}"], key=f"cmp.frontier.{shape}")
    labels = {i: f"{names.get(r['method'], r['method'])}{' #' + str(r['seed']) if 'seed' in r else ''}"
                 f" · {r['budget']:.0%} · {r['shape']} → layers {r['set']} "
                 f"(ΔNLL {r['continuation_nll_delta']:+.3f})" for i, r in enumerate(cmp.rows)}
    a, b = st.columns([5, 1], vertical_alignment="bottom")
    i = a.selectbox("Any point of the frontiers", list(labels), format_func=labels.get, key="cmp.point")
    b.button("Use this set", key="cmp.use", disabled=cmp.n_layers != n, on_click=_use,
             args=(cmp.rows[i]["skip_layers"], n, labels[i].split(" → ")[0]))
    state.show_flash()
    shown = ("method", "budget", "shape", "k", "set", "continuation_nll_delta", "continuation_nll_delta_ci",
             "next_token_kl", "next_token_top1", "ideal_speedup", "prefill_speedup", "timing_trustworthy",
             "jaccard_dropone")
    widgets.table([{k: r.get(k) for k in shown} for r in cmp.rows], hide_index=True)
    return figs
