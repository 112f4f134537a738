"""Stage-aware precision: the frontier of TTFT speedup against quality (pure plotly)."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts.style import FLAGGED, FULL, INT8, POP, layout


def frontier_chart(points, frontier_names=(), current: str | None = None) -> go.Figure:
    """One marker per configuration (x: continuation KL to the full model, y: TTFT speedup over
    it); the frontier joined by a line, timings the protocol flagged drawn hollow in red, the
    current setting ringed."""
    fig = go.Figure()
    front = sorted((p for p in points if p.name in frontier_names), key=lambda p: p.loss)
    if front:
        fig.add_trace(go.Scatter(x=[p.loss for p in front], y=[p.speedup for p in front],
                                 mode="lines", name="frontier", line=dict(color=POP, width=2)))
    for p in points:
        colour = FULL if p.name == "full" else INT8 if "int8" in p.name else POP
        fig.add_trace(go.Scatter(
            x=[p.loss], y=[p.speedup], mode="markers+text", text=[p.name],
            textposition="top center", name=p.name, showlegend=False,
            marker=dict(size=16 if p.name == current else 11,
                        color="white" if not p.trustworthy else colour,
                        line=dict(color=FLAGGED if not p.trustworthy else
                                  ("black" if p.name == current else colour), width=2)),
            hovertemplate=(f"{p.name}<br>KL %{{x:.4f}} nats<br>TTFT %{{y:.2f}}x"
                           + ("<br>timing flagged" if not p.trustworthy else "")
                           + "<extra></extra>")))
    layout(fig, "TTFT speedup against quality (up and left is better)", height=420,
           xaxis_title="continuation KL to the full model (nats per token)",
           yaxis_title="TTFT speedup over the full model (x)")
    return fig
