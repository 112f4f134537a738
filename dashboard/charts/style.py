"""What every chart shares: colours, the layout frame, the shading of skipped layers.

Colours are fixed per meaning across pages: prefill = blue, decode = orange, skipped block =
grey shading, POP = green, full = dark grey.
"""
from __future__ import annotations

import plotly.graph_objects as go

PREFILL, DECODE, POP, FULL = "#1f77b4", "#ff7f0e", "#2ca02c", "#444444"
FLAGGED = "#d62728"  # a speed the timing protocol did not trust
INT8 = "#9467bd"  # a layer whose prompt runs in int8 (stage-aware precision)
HEAL = "#17becf"  # self-healing: the pruned layers re-run after the first token
SKIP_SHADE = "rgba(120,120,120,0.15)"


FONT = dict(size=14, color="#222")  # readable from the back of a room; plotly's default is 12 grey
PROJECTOR_FONT = 20


def layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    """The frame every chart shares. The title sits on its own line above the plot and the mode
    bar (top right, on hover) above it, so neither covers the other."""
    kw.setdefault("legend", dict(orientation="h", y=-0.2))
    kw.setdefault("margin", dict(l=60, r=20, t=80, b=50))
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", y=1, yanchor="bottom",
                                 yref="paper", pad=dict(b=12), font=dict(size=17)),
                      height=height, font=FONT, **kw)
    return fig


def for_projector(fig: go.Figure, height: int | None = None, title: bool = True) -> go.Figure:
    """The same figure for a projector: larger type, thicker lines, a taller plot (or `height`
    pixels, for a page that must fit one screen; without the title where the page says it)."""
    fig = go.Figure(fig)
    scale = PROJECTOR_FONT / FONT["size"]
    fig.update_layout(font=dict(size=PROJECTOR_FONT, color="#111"),
                      title_font=dict(size=round(17 * scale)),
                      height=height or round((fig.layout.height or 360) * 1.25),
                      margin=dict(l=80, r=30, t=(100 if height is None else 70) if title else 40,
                                  b=70))
    if not title:
        fig.update_layout(title_text=None)
    fig.update_annotations(font_size=PROJECTOR_FONT - 2)
    for trace in fig.data:
        if trace.type == "scatter" and trace.line is not None and trace.line.width:
            trace.line.width = trace.line.width * 1.6
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


OVERLAY_COLOURS = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd")


def alpha(hex_colour: str, a: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{a})"
