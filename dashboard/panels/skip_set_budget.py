"""The Skip set page's budgeted choice: the largest set whose POP quality stays inside a budget
(judged on the 95% interval's bound), searched along one method's ranking on held-out items."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import methods as charts
from dashboard.panels import exports, widgets
from dashboard.panels.methods_scores import _use
from dashboard.session import cached, jobs, state
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.experiments import choose as ch
from pop_analysis.experiments.methods_run import ImportanceConfig, cached_importance
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES
from pop_analysis.progress import duration

JOB = "choose"


def section(lm: LoadedModel) -> None:
    n = lm.adapter.n_layers
    st.subheader("Largest set within a quality budget")
    st.caption("Bisection over k along a method's ranking, then a greedy refinement; each candidate "
               "is re-measured by POP on held-out items, and a budget is met only when the 95% "
               "interval's bound stays inside it (not the mean).")
    c = st.columns(4)
    use_nll = c[0].checkbox("Largest ΔNLL", key=state.kept("bud.use_nll", True))
    max_nll = widgets.number(c[0], "nats/token (upper bound)", 0.0, 10.0, step=0.01, format="%.3f",
                            key=state.kept("bud.nll", 0.1), disabled=not use_nll)
    use_top1 = c[1].checkbox("Smallest top-1 agreement", key=state.kept("bud.use_top1", False))
    min_top1 = widgets.number(c[1], "share (lower bound)", 0.01, 1.0, step=0.01, format="%.2f",
                              key=state.kept("bud.top1", 0.9), disabled=not use_top1)
    method = c[2].selectbox("Ranking of", list(METHODS), format_func=lambda m: METHODS[m].title,
                            key=state.kept("bud.method", "gate"))
    shape = c[2].radio("Shape", SHAPES, horizontal=True, key=state.kept("bud.shape", "free"))
    items = widgets.number(c[3], "Held-out GSM8K items", 2, 1319, key=state.kept("bud.n", 16))
    prompts = widgets.number(c[3], "Ranking prompts (built-in)", 1, 200,
                             key=state.kept("bud.rank_n", 8), help="used when the Methods page holds no run of this method")
    most = widgets.number(c[1], "Most sets measured", 1, 100, key=state.kept("bud.most", 24),
                          help="the search stops after this many candidates")
    if st.button("Find the largest set", type="primary", key="bud.go",
                 disabled=jobs.running(JOB) or widgets.refused()):
        try:
            budget = ch.Budget(max_nll if use_nll else None, min_top1 if use_top1 else None)
            cfg = ch.ChooseConfig(method=method, shape=shape, n_samples=int(items),
                                  max_candidates=int(most))
            rcfg = ImportanceConfig(methods=(method,), n_samples=int(prompts))
        except ValueError as e:
            st.error(f"Cannot search: {first_line(e)}")
        else:
            _start(lm, budget, cfg, rcfg)
    jobs.panel(JOB)
    show(lm, n)


def _start(lm: LoadedModel, budget, cfg, rcfg) -> None:
    """The Methods page's run when it holds this method for this model, else a stored or new
    run on the built-in prompts, walked by the search in a background job."""
    held = st.session_state.get(state.IMPORTANCE)
    if held is not None and (held.model != lm.name or cfg.method not in held.methods):
        held = None
    prompts = None if held is not None else cached.prompt_set("builtin", None, rcfg.n_samples)

    def run(progress):
        ranking = held or cached_importance(lm, prompts, rcfg, True, progress, progress.notice)[0]
        return ch.cached_choice(lm, ranking, budget, cfg, True, progress, progress.notice)

    now = {"budget": budget.describe(), "method": METHODS[cfg.method].title, "shape": cfg.shape,
           "items": cfg.n_samples, "ranked on": "the Methods page's run" if held else
           f"{rcfg.n_samples} built-in prompts"}
    jobs.start(JOB, f"Searching the largest set ({budget.describe()})", run,
               lambda job: jobs.outcome(job, state.CHOICE, "Budgeted choice", "use fewer items.",
                                        lambda p: f"{len(p.candidates)} sets",
                                        lambda r: f"{len(r.candidates)} sets measured in "
                                                  f"{duration(r.seconds)}"), context=now)


def show(lm: LoadedModel, n: int) -> None:
    res = st.session_state.get(state.CHOICE)
    if res is None:
        return
    # the line from the result's own fields: a result stored before the speed flags read plain
    (st.success if res.met else st.warning)(ch.outcome_line(res, ch.Budget(**res.budget)))
    fig = charts.candidates_chart(res.candidates, res.budget.get("max_delta_nll"), res.chosen)
    st.plotly_chart(fig, key="bud.chart")
    layers = res.chosen if res.met else (res.best_found or {}).get("skip_layers", [])
    what = "chosen set" if res.met else "best set found (misses the budget)"
    st.button(f"Use this set: layers {describe(layers)}", key="bud.use",
              disabled=not layers or res.n_layers != n,
              on_click=_use, args=(layers, n, f"budgeted choice, {what}"))
    rows = [{k: c.get(k) for k in ("phase", "k", "set", "continuation_nll_delta",
                                   "continuation_nll_delta_ci", "next_token_top1",
                                   "next_token_top1_ci", "meets")} for c in res.candidates]
    widgets.table(rows, hide_index=True)
    exports.offer("budgeted_choice", data=res.to_dict(), rows=rows, figures={"candidates": fig})
