"""Overlays of stored sweeps on the Sweeps page's charts (pure plotly, no streamlit)."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts import OVERLAY_COLOURS


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
