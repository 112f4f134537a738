"""Overlays of stored sweeps on the Sweeps page's charts (pure plotly, no streamlit)."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts.style import OVERLAY_COLOURS


def overlay_sweeps(fig: go.Figure, overlays: list[dict], x_key: str,
                   quality: str | None = None) -> go.Figure:
    """Add each stored sweep ({"label", "rows"}) as thin dashed lines: its measured speedup on
    the left axis and, when `quality` is given, that metric on the right axis (y2)."""
    for j, o in enumerate(overlays):
        colour = OVERLAY_COLOURS[j % len(OVERLAY_COLOURS)]
        rows = sorted((r for r in o["rows"] if r.get(x_key) is not None), key=lambda r: r[x_key])
        x = [r[x_key] for r in rows]
        fig.add_trace(go.Scatter(x=x, y=[r.get("prefill_speedup") for r in rows], mode="lines+markers",
                                 name=f"{o['label']} · speedup", opacity=0.85,
                                 line=dict(color=colour, dash="dash", width=1.5),
                                 marker=dict(size=5)))
        if quality:
            fig.add_trace(go.Scatter(x=x, y=[r.get(quality) for r in rows], yaxis="y2",
                                     mode="lines+markers", name=f"{o['label']} · {quality}",
                                     opacity=0.85, line=dict(color=colour, dash="dot", width=1.5),
                                     marker=dict(size=5, symbol="diamond")))
    return fig


def relative_depth(n_layers: int) -> list[float]:
    """Layer i of n at depth i / (n - 1): 0 = first layer, 1 = last (models of different depth
    line up by where in the stack a layer sits)."""
    return [i / (n_layers - 1) if n_layers > 1 else 0.0 for i in range(n_layers)]


def importance_by_depth(curves: list[dict], share: bool = True) -> go.Figure:
    """Prefill (dotted) and decode (solid) importance of several models ({"label", "prefill",
    "decode"}) against relative depth, log axis. With `share`, each curve is divided by the
    model's total decode importance, so models whose losses differ in scale compare in shape
    while prefill and decode of one model keep their ratio."""
    from dashboard.charts.axes import clip_to_floor, log_floor
    from dashboard.charts.style import layout

    scaled = []
    for c in curves:
        total = sum(c["decode"]) if share else 1.0
        total = total if total > 0 else 1.0
        scaled.append({**c, **{s: [v / total for v in c[s]] for s in ("prefill", "decode")}})
    floor = log_floor(*[c[s] for c in scaled for s in ("prefill", "decode")])
    fig = go.Figure()
    for j, c in enumerate(scaled):
        colour = OVERLAY_COLOURS[j % len(OVERLAY_COLOURS)]
        x = relative_depth(len(c["prefill"]))
        for stage, dash in (("decode", "solid"), ("prefill", "dot")):
            shown, _ = clip_to_floor(c[stage], floor)
            fig.add_trace(go.Scatter(
                x=x, y=shown, mode="lines+markers", name=f"{c['label']} · {stage}",
                line=dict(color=colour, dash=dash, width=2), marker=dict(size=5),
                customdata=list(range(len(x))),
                hovertemplate="layer %{customdata} (depth %{x:.2f}): %{y:.3g}<extra></extra>"))
    fig.add_vrect(x0=2 / 3, x1=1.0, fillcolor="rgba(128,128,128,0.12)", line_width=0,
                  layer="below", annotation_text="last third")
    fig.update_xaxes(title="relative depth (layer / (layers − 1))", range=[-0.02, 1.02])
    fig.update_yaxes(type="log", exponentformat="power",
                     title="share of the model's decode importance" if share else "importance")
    return layout(fig, "Importance by relative depth: one model per colour", height=420)
