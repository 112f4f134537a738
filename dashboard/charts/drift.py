"""Drift figures: per-layer cosine curves, per-token heatmaps, decode steps, drift vs length.

Pure plotly builders like charts.py."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts.axes import TICKS, padded_range
from dashboard.charts.style import DECODE, FULL, POP, layout, shade_layers

COSINES = {"hidden": "#1f77b4", "k": "#9467bd", "v": "#d62728", "attn_out": "#2ca02c"}
COSINE_NAMES = {"hidden": "hidden state", "k": "K cache", "v": "V cache",
                "attn_out": "attention output (decode)"}


# ---------- drift ----------

def drift_curves(drift: dict, skip, only_skipped: bool = True, y_range=None,
                 title: str = "Representation drift across the skipped block") -> go.Figure:
    """Mean cosine POP vs full per layer for hidden, K, V and attention output (paper style).
    y_range: a shared range when two runs are shown side by side."""
    n = len(drift["hidden_cos"])
    layers = sorted(skip) if only_skipped and skip else list(range(n))
    fig = go.Figure()
    for key, colour in COSINES.items():
        vals = drift.get(f"{key}_cos")
        if vals is None:
            continue
        fig.add_trace(go.Scatter(x=layers, y=[vals[i] for i in layers], mode="lines+markers",
                                 name=COSINE_NAMES[key], line=dict(color=colour, width=2)))
        mins = drift.get(f"{key}_min")
        if mins is not None:
            fig.add_trace(go.Scatter(x=layers, y=[mins[i] for i in layers], mode="lines",
                                     name=f"{COSINE_NAMES[key]} (min over tokens)",
                                     line=dict(color=colour, dash="dot", width=1)))
    if not only_skipped:
        shade_layers(fig, skip)
    fig.update_xaxes(title="layer", dtick=1)
    fig.update_yaxes(title="cosine similarity POP vs full", tickformat=TICKS, range=y_range)
    return layout(fig, title, height=420)


def drift_range(*drifts: dict) -> list[float] | None:
    """One y range covering the cosines (means and minima) of several drift runs."""
    vals = [v for d in drifts for q in COSINES for suffix in ("_cos", "_min")
            for v in (d.get(f"{q}{suffix}") or [])]
    return padded_range(vals, min_span_rel=0.05, upper=1.02)


def drift_heatmap(matrix, tokens=None, title: str = "per-token cosine",
                  x_title: str = "prompt token (downsampled)") -> go.Figure:
    """Layer x token cosine matrix; red = drifted, white/blue = unchanged."""
    n_tok = len(matrix[0]) if matrix else 0
    x = list(range(n_tok))
    fig = go.Figure(go.Heatmap(z=matrix, x=x, y=list(range(len(matrix))), colorscale="RdBu",
                               zmax=1.0, zmid=None, colorbar=dict(title="cos"),
                               customdata=[tokens] * len(matrix) if tokens else None,
                               hovertemplate=("layer %{y}, token %{x}"
                                              + (" %{customdata}" if tokens else "")
                                              + ": cos %{z:.3f}<extra></extra>")))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title="layer")
    return layout(fig, title, height=420)


def decode_steps_chart(kl, top1) -> go.Figure:
    """KL(full || POP) and top-1 agreement for each decode step."""
    steps = list(range(len(kl)))
    fig = go.Figure(go.Bar(x=steps, y=kl, name="KL(full ‖ POP)", marker_color=DECODE))
    fig.add_trace(go.Scatter(x=steps, y=top1, name="top-1 agreement", yaxis="y2",
                             mode="lines+markers", line=dict(color=POP)))
    fig.update_layout(yaxis=dict(title="KL(full ‖ POP), nats", range=padded_range(kl, lower=0.0),
                                 tickformat=TICKS),
                      yaxis2=dict(title="top-1 agreement", overlaying="y", side="right",
                                  range=[0, 1.05], showgrid=False, tickformat=".0%"))
    fig.update_xaxes(title="decode step (0 = boundary token's prediction)")
    return layout(fig, "Next-token distribution: POP vs full, per decode step", height=340)


def drift_length_chart(rows: list[dict]) -> go.Figure:
    """Block-mean cosines and KL against context length."""
    lengths = [r["length"] for r in rows]
    fig = go.Figure()
    for key, colour in COSINES.items():
        fig.add_trace(go.Scatter(x=lengths, y=[r.get(f"{key}_cos", r.get(key)) for r in rows], mode="lines+markers",
                                 name=COSINE_NAMES[key], line=dict(color=colour)))
    kl = [r["kl"] for r in rows]
    cos = [r.get(f"{k}_cos", r.get(k)) for r in rows for k in COSINES]
    fig.add_trace(go.Scatter(x=lengths, y=kl, name="KL (mean over steps)",
                             yaxis="y2", mode="lines+markers", line=dict(color=FULL, dash="dash")))
    fig.update_layout(yaxis=dict(title="mean cosine over the skipped block", tickformat=TICKS,
                                 range=padded_range(cos, upper=1.0 + 0.02)),
                      yaxis2=dict(title="KL(full ‖ POP), nats", overlaying="y", side="right",
                                  showgrid=False, tickformat=TICKS, range=padded_range(kl, lower=0.0)))
    fig.update_xaxes(title="context length (tokens)", type="log")
    return layout(fig, "Drift vs context length", height=380)
