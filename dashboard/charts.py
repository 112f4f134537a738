"""Pure plotly figure builders: plain data in, a Figure out (no streamlit, no model).

Colours are fixed per meaning across pages: prefill = blue, decode = orange, skipped block =
grey shading, POP = green, full = dark grey.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go

from dashboard.axes import FLOOR_MARK, TICKS, clip_to_floor, log_floor

PREFILL, DECODE, POP, FULL = "#1f77b4", "#ff7f0e", "#2ca02c", "#444444"
FLAGGED = "#d62728"  # a speed the timing protocol did not trust
SKIP_SHADE = "rgba(120,120,120,0.15)"


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.2), **kw)
    return fig


def shade_layers(fig: go.Figure, skip, label: str = "skipped in prefill") -> go.Figure:
    """Grey bands behind the skipped layers, one per contiguous run."""
    for lo, hi in runs(skip):
        fig.add_vrect(x0=lo - 0.5, x1=hi + 0.5, fillcolor=SKIP_SHADE, line_width=0, layer="below",
                      annotation_text=label if lo == runs(skip)[0][0] else None,
                      annotation_position="top left")
    return fig


def runs(layers) -> list[tuple[int, int]]:
    """(3, 4, 5, 9) -> [(3, 5), (9, 9)]."""
    out: list[tuple[int, int]] = []
    for i in sorted(layers):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


# ---------- overview ----------

def pop_diagram(n_layers: int, skip, n_prompt: int = 8, n_new: int = 3) -> go.Figure:
    """Layers x positions: what runs where under POP (prefill pruned, boundary and decode full)."""
    skip = set(skip)
    cols = [f"x{i}" for i in range(1, n_prompt)] + ["x_N"] + [f"y{i}" for i in range(1, n_new + 1)]
    z, text = [], []
    for layer in range(n_layers):
        row = [1 if (layer in skip and c < n_prompt - 1) else 0 for c in range(len(cols))]
        z.append(row)
        text.append(["K/V only" if v else "full" for v in row])
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=list(range(n_layers)), text=text, zmin=0, zmax=1, showscale=False,
        colorscale=[[0, "#cfe3f5"], [0.5, "#cfe3f5"], [0.5, "#f3b37a"], [1, "#f3b37a"]],
        xgap=2, ygap=1, hovertemplate="layer %{y}, %{x}: %{text}<extra></extra>"))
    fig.add_vline(x=n_prompt - 1.5, line_dash="dash", line_color=FULL)
    fig.add_vline(x=n_prompt - 0.5, line_dash="dash", line_color=FULL)
    top = n_layers - 0.5
    for x, label in ((n_prompt / 2 - 1, "prefill x1..x(N-1): pruned"),
                     (n_prompt - 1, "boundary x_N: full"), (n_prompt - 0.5 + n_new / 2, "decode: full")):
        fig.add_annotation(x=x, y=top, yshift=14, text=label, showarrow=False)
    fig.update_yaxes(title="layer", autorange=True)
    fig.update_xaxes(title="position (prompt, then generated)", side="bottom")
    return _layout(fig, "What runs where: blue = full layer, orange = independent K/V projection only",
                   height=max(320, 14 * n_layers + 120))


# ---------- importance ----------

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
    return _layout(fig, "Layer strip (crossed = skipped in prefill)", height=200)


OVERLAY_COLOURS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd")


def importance_chart(prefill, decode, prefill_std=None, decode_std=None, log: bool = True,
                     bands: bool = True, block_influence: dict | None = None, skip=(),
                     overlays: list[dict] | None = None) -> go.Figure:
    """Prefill vs decode importance per layer (mean of (dL/dg)^2), with +-1 std bands.

    overlays: other calibrations ({"label", "prefill", "decode"}) drawn as thin dotted lines.
    On a log axis a zero cannot be drawn: it is drawn at a floor a decade below the smallest
    positive value, with a down-triangle, and the legend says so. Bands never go below zero.
    """
    x = list(range(len(prefill)))
    overlays = overlays or []
    floor = log_floor(prefill, decode, *[o[s] for o in overlays for s in ("prefill", "decode")]) \
        if log else None
    fig = go.Figure()
    raised_any = False
    for name, mean, std, colour in (("prefill", prefill, prefill_std, PREFILL),
                                    ("decode", decode, decode_std, DECODE)):
        shown, raised = clip_to_floor(mean, floor)
        raised_any |= bool(raised)
        if bands and std is not None:
            lo = [max(m - s, floor if log and floor else 0.0) for m, s in zip(mean, std)]
            hi = [max(m + s, floor if log and floor else 0.0) for m, s in zip(mean, std)]
            fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line_width=0,
                                     fillcolor=_alpha(colour, 0.18), hoverinfo="skip",
                                     name=f"{name} ±1 std", showlegend=True))
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
    shade_layers(fig, skip)
    fig.update_layout(yaxis=dict(type="log" if log else "linear", exponentformat="power",
                                 title="importance E[(dL/dg)²]" + (" (log)" if log else ""),
                                 rangemode="normal" if log else "tozero"))
    fig.update_xaxes(title="layer")
    return _layout(fig, "Stage-aware layer importance: prefill vs decode", height=440)


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
    return _layout(fig, f"Taylor vs exact ({stage})", height=340)


def _alpha(hex_colour: str, a: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{a})"


# ---------- generation ----------

def call_counts_heatmap(counts: dict, title: str) -> go.Figure:
    """counts[stage][kind][layer] -> a stage·kind x layer heatmap with the numbers printed."""
    rows, z = [], []
    for stage in ("prefill", "boundary", "decode"):
        for kind, per_layer in counts.get(stage, {}).items():
            rows.append(f"{stage} · {kind}")
            z.append(per_layer)
    fig = go.Figure(go.Heatmap(z=z, y=rows, x=list(range(len(z[0]) if z else 0)), text=z,
                               texttemplate="%{text}", colorscale="Blues", showscale=False,
                               hovertemplate="layer %{x}, %{y}: %{z} calls<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="layer", dtick=1 if len(z[0] if z else []) <= 40 else 4)
    return _layout(fig, title, height=60 + 28 * max(len(rows), 1))


def arrival_chart(series: dict) -> go.Figure:
    """Seconds since the prompt went in at which each token arrived, per variant."""
    fig = go.Figure()
    for name, times in series.items():
        fig.add_trace(go.Scatter(x=list(range(len(times))), y=times, mode="lines+markers", name=name,
                                 line=dict(color=FULL if name == "full" else POP)))
    fig.update_xaxes(title="generated token")
    fig.update_yaxes(title="seconds since prompt in", rangemode="tozero")
    return _layout(fig, "Token arrival (the first point is the TTFT)", height=300)
