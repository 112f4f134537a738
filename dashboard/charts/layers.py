"""Pictures of the layer stack: the clickable layer strip, per-layer call counts (pure plotly, no
streamlit, no model). What runs where is drawn from recorded runs (charts/stepthrough.py)."""
from __future__ import annotations

import math

import plotly.graph_objects as go

from dashboard.charts.style import DECODE, FULL, PREFILL, layout


def layer_strip(n_layers: int, skip, importance=None, label: str = "prefill importance") -> go.Figure:
    """One clickable square per layer (a crossed square = skipped), coloured by log10 importance
    when scores exist. Markers, not bars: plotly selects markers reliably by click and by box."""
    skip = set(skip)
    x = list(range(n_layers))
    size = max(8, min(28, 900 // max(n_layers, 1)))
    marker = dict(symbol=["square-x" if i in skip else "square" for i in x], size=size,
                  line=dict(color=[FULL if i in skip else "white" for i in x], width=2))
    if importance is not None:
        floor = max(max(importance), 1e-30) * 1e-6  # six decades: a zero must not flatten the scale
        logs = [math.log10(max(v, floor)) for v in importance]
        marker.update(color=logs, colorscale="Viridis", showscale=True,
                      colorbar=dict(title=f"log10 {label}", thickness=10))
        hover = [f"layer {i}<br>{label} {importance[i]:.3g}" for i in x]
    else:
        marker.update(color=[DECODE if i in skip else PREFILL for i in x])
        hover = [f"layer {i}" for i in x]
    hover = [h + ("<br><b>skipped</b>" if i in skip else "") for i, h in zip(x, hover)]
    fig = go.Figure(go.Scatter(x=x, y=[0] * n_layers, mode="markers", marker=marker,
                               hovertext=hover, hoverinfo="text"))
    fig.update_yaxes(visible=False, fixedrange=True, range=[-1, 1])
    fig.update_xaxes(title="layer (click: toggle · box tool, top right: choose a range)",
                     dtick=1 if n_layers <= 40 else 4, range=[-0.7, n_layers - 0.3], fixedrange=True)
    # clickmode and dragmode are left to Streamlit: with point selection on it makes a click
    # select the point. Plotly drops click-to-select while the box tool is the drag mode, so the
    # box is a tool picked in the mode bar rather than the default drag.
    return layout(fig, "Layer strip (crossed = skipped in prefill)", height=250)


def call_counts_heatmap(counts: dict, title: str) -> go.Figure:
    """counts[stage][kind][layer] -> a stage·kind x layer heatmap with the numbers printed
    (healing's chunks, between decode steps, are a stage of their own)."""
    rows, z = [], []
    for stage in ("prefill", "boundary", "decode", "heal"):
        for kind, per_layer in counts.get(stage, {}).items():
            rows.append(f"{stage} · {kind}")
            z.append(per_layer)
    fig = go.Figure(go.Heatmap(z=z, y=rows, x=list(range(len(z[0]) if z else 0)), text=z,
                               texttemplate="%{text}", colorscale="Blues", showscale=False,
                               hovertemplate="layer %{x}, %{y}: %{z} calls<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="layer", dtick=1 if len(z[0] if z else []) <= 40 else 4)
    fig.update_yaxes(tickmode="array", tickvals=rows)  # every row named
    return layout(fig, title, height=150 + 30 * max(len(rows), 1))
