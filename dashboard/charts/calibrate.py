"""The Calibrate page's figures: prefill vs decode importance per layer, Taylor vs exact
(pure plotly, no streamlit, no model)."""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from dashboard.charts.axes import FLOOR_MARK, TICKS, clip_to_floor, log_floor
from dashboard.charts.style import (
    DECODE,
    FULL,
    OVERLAY_COLOURS,
    PREFILL,
    alpha,
    layout,
    shade_layers,
)


@dataclass(frozen=True)
class ImportanceView:
    """How the importance chart is drawn: the page's toggles and what it lays over the curves.

    overlays: other calibrations ({"label", "prefill", "decode"}) drawn as thin dotted lines;
    block_influence: ShortGPT's score per stage on a right axis; skip: layers shaded.
    """

    log: bool = True
    bands: bool = True
    block_influence: dict | None = None
    skip: tuple = ()
    overlays: tuple = ()
    band_name: str = "95% interval"


def importance_chart(prefill, decode, prefill_band=None, decode_band=None,
                     view: ImportanceView = ImportanceView()) -> go.Figure:
    """Prefill vs decode importance per layer (mean of (dL/dg)^2), with bands of the given
    half-widths around the means (the 95% interval of each mean: a ±1 std band over samples
    covered most of a log axis and hid the curves).

    On a log axis a zero cannot be drawn: it is drawn at a floor a decade below the smallest
    positive value, with a down-triangle, and the legend says so. Bands never go below zero.
    """
    log, bands, block_influence = view.log, view.bands, view.block_influence
    x = list(range(len(prefill)))
    overlays = list(view.overlays or [])
    floor = log_floor(prefill, decode, *[o[s] for o in overlays for s in ("prefill", "decode")]) \
        if log else None
    fig = go.Figure()
    raised_any = False
    for name, mean, std, colour in (("prefill", prefill, prefill_band, PREFILL),
                                    ("decode", decode, decode_band, DECODE)):
        shown, raised = clip_to_floor(mean, floor)
        raised_any |= bool(raised)
        if bands and std is not None:
            lo = [max(m - s, floor if log and floor else 0.0) for m, s in zip(mean, std)]
            hi = [max(m + s, floor if log and floor else 0.0) for m, s in zip(mean, std)]
            fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line_width=0,
                                     fillcolor=alpha(colour, 0.18), hoverinfo="skip",
                                     name=f"{name} {view.band_name}", showlegend=True))
        fig.add_trace(go.Scatter(x=x, y=shown, mode="lines+markers", name=f"{name} importance",
                                 line=dict(color=colour, width=2), customdata=mean,
                                 hovertemplate="layer %{x}: %{customdata:.3g}<extra></extra>",
                                 marker=dict(symbol=[FLOOR_MARK if i in raised else "circle"
                                                     for i in x], size=7)))
    for j, o in enumerate(overlays):
        colour = OVERLAY_COLOURS[j % len(OVERLAY_COLOURS)]
        for stage, dash in (("prefill", "dot"), ("decode", "dash")):
            shown, raised = clip_to_floor(o[stage], floor)
            raised_any |= bool(raised)
            fig.add_trace(go.Scatter(x=x[:len(shown)], y=shown, mode="lines", opacity=0.8,
                                     name=f"{o['label']} · {stage}", customdata=o[stage],
                                     line=dict(color=colour, width=1.5, dash=dash),
                                     hovertemplate="layer %{x}: %{customdata:.3g}<extra>"
                                                   + f"{o['label']} · {stage}</extra>"))
    if raised_any:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="0: drawn at the floor",
                                 marker=dict(symbol=FLOOR_MARK, color=FULL, size=8)))
    if block_influence:
        for name, colour in (("prefill", PREFILL), ("decode", DECODE)):
            if block_influence.get(name):
                fig.add_trace(go.Scatter(x=x, y=block_influence[name], yaxis="y2", mode="lines",
                                         name=f"block influence ({name})",
                                         line=dict(color=colour, dash="dot")))
        fig.update_layout(yaxis2=dict(title="block influence (1 − cos)", overlaying="y",
                                      side="right", showgrid=False, type="linear",
                                      rangemode="tozero", tickformat=TICKS))
    shade_layers(fig, view.skip)
    fig.update_layout(yaxis=dict(type="log" if log else "linear", exponentformat="power",
                                 title="importance E[(dL/dg)²]" + (" (log)" if log else ""),
                                 rangemode="normal" if log else "tozero"))
    fig.update_xaxes(title="layer")
    return layout(fig, "Stage-aware layer importance: prefill vs decode", height=440)


def rank_scatter(taylor, exact, stage: str) -> go.Figure:
    """Taylor estimate vs exact leave-one-layer-out loss increase, one point per layer."""
    floor = log_floor(taylor)
    shown, raised = clip_to_floor(taylor, floor)
    fig = go.Figure(go.Scatter(x=exact, y=shown, mode="markers+text", customdata=taylor,
                               text=[str(i) for i in range(len(taylor))], textposition="top center",
                               hovertemplate="layer %{text}: exact %{x:.3g}, Taylor "
                                             "%{customdata:.3g}<extra></extra>",
                               marker=dict(color=PREFILL if stage == "prefill" else DECODE,
                                           symbol=[FLOOR_MARK if i in raised else "circle"
                                                   for i in range(len(taylor))])))
    fig.update_xaxes(title="exact: loss increase when the layer is removed", tickformat=TICKS)
    fig.update_yaxes(title="Taylor: E[(dL/dg)²] (log" + ("; ▼ = 0, at the floor)" if raised else ")"),
                     type="log", exponentformat="power")
    return layout(fig, f"Taylor vs exact ({stage})", height=340)
