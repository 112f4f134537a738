"""The Methods page's scores: what each method measures, every curve on one chart, the rank
agreement and angular-distance heatmaps, a method's set for any k, and the downloads."""
from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from dashboard.charts import methods as charts
from dashboard.panels import exports
from dashboard.session import state
from pop_analysis.engine.skipset import describe
from pop_analysis.importance.methods import METHODS, method_of, primary
from pop_analysis.importance.picks import SHAPES, BudgetError, pick
from pop_analysis.speed.flops import ideal_speedup
from pop_vllm.run_setting import RunSetting, SettingError

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel


def titles(res) -> dict:
    """Legend labels: 'Gate Fisher · prefill' for a series key, the method's title for a name."""
    out = {m: METHODS[m].title for m in METHODS}
    out.update({k: f"{method_of(k).title} · {k.split('.', 1)[1]}" for k in res.series})
    return out


def teaching(res) -> None:
    with st.expander("What each method measures", expanded=False):
        st.markdown("\n".join(
            f"- **{METHODS[m].title}** (`{m}`): {METHODS[m].teaching} *Cost: {METHODS[m].cost}. "
            f"Source: {METHODS[m].source}.*" for m in res.methods))
        st.caption("Every score is oriented so that larger = more important. Tokens read: "
                   + "; ".join(f"{part}: {text}" for part, text in res.tokens.items()) + ".")


def show(lm: LoadedModel, res) -> dict:
    """The result's charts; returns them by name for the downloads."""
    n = lm.adapter.n_layers
    names = titles(res)
    teaching(res)
    keys = list(res.series)
    shown = st.multiselect("Curves shown", keys, format_func=names.get,
                           default=[primary(m) for m in res.methods], key="imp.shown",
                           help="each method's series that picks its skip sets is shown first; "
                                "click a legend entry to hide a curve")
    skip = state.skip_for(n) if res.n_layers == n else ()
    figs = {"curves": charts.curves_chart(res.series, names, shown or keys[:1], skip)}
    st.plotly_chart(figs["curves"], key="imp.curves")
    a, b = st.columns(2)
    kind = a.radio("Agreement", ("kendall", "spearman"), horizontal=True, key="imp.agree",
                   format_func={"kendall": "Kendall τ", "spearman": "Spearman ρ"}.get)
    figs["agreement"] = charts.agreement_heatmap(res.agreement, kind)
    a.plotly_chart(figs["agreement"], key="imp.agreement")
    if res.triangle:
        figs["triangle"] = charts.triangle_heatmap(res.triangle)
        b.plotly_chart(figs["triangle"], key="imp.triangle")
    else:
        b.info("Run the angular distance method for the (layer × span) triangle.")
    use_ranking(lm, res, names)
    return figs


def use_ranking(lm: LoadedModel, res, names) -> None:
    """Any method's k lowest layers (or its best block) as the shared skip set."""
    n = lm.adapter.n_layers
    st.markdown("**A method's skip set for any k**")
    c = st.columns([2, 2, 1, 1], vertical_alignment="bottom")
    method = c[0].selectbox("Method", res.methods, format_func=names.get, key="imp.use.m")
    k = c[1].slider("Layers skipped (k)", 1, max(1, res.n_layers - 1), key="imp.use.k",
                    value=max(1, round(res.n_layers / 3)))
    shape = c[2].radio("Shape", SHAPES, key="imp.use.shape")
    try:
        layers = pick(res.series[primary(method)], k, shape)
    except BudgetError as e:
        st.error(str(e))
        return
    c[3].button("Use this set", key="imp.use.go", disabled=res.n_layers != n,
                on_click=_use, args=(layers, n, f"{names[method]}, k = {k}, {shape}"))
    st.caption(f"{names[method]} picks layers {describe(layers)}: ideal prefill speedup "
               f"{ideal_speedup(lm.adapter.shape, 512, RunSetting(layers)):.2f}× at 512 tokens.")
    state.show_flash()


def _use(layers, n: int, label: str) -> None:
    try:
        state.set_skip(layers, n)
        state.flash("success", f"Skip set: {label} → layers {describe(layers)} (every page)")
    except SettingError as e:
        state.flash("error", f"Skip set unchanged: {e}")


def downloads(res, comparison, figs: dict) -> None:
    """The scores per layer as CSV; the run and its comparison as JSON; every figure."""
    rows = [{"layer": i, **{k: v[i] for k, v in res.series.items()}} for i in range(res.n_layers)]
    data = {"importance": res.to_dict(), "comparison": comparison.to_dict() if comparison else None}
    exports.offer("importance_methods", data=data, rows=rows, figures=figs)
