"""Figures for the logit lens on the Generate page (pure plotly, no streamlit, no model)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts.style import DECODE, FULL, POP, layout


def commitment_strip(rows: list[dict], n_layers: int, first: int | None = None) -> go.Figure:
    """One column per model, one row per generated token, each cell holding the whole token: the
    layer from which the token stays the lens's top-1 up to the output (light = decided early,
    dark = late; blank = never, i.e. a sampled token the model did not rank first).
    rows: {"name", "pieces", "commit"}. Tokens run down the page, so none is cut short."""
    length = max(len(r["commit"]) for r in rows) if rows else 0
    z, text, hover = [], [], []
    for i in range(length):
        cells = [(r["pieces"][i], r["commit"][i]) if i < len(r["commit"]) else ("", None)
                 for r in rows]
        z.append([c for _, c in cells])
        text.append([_short(p, 24) for p, _ in cells])
        hover.append([f"token {i} {p!r}: " + (f"top-1 from layer {c} on" if c is not None else
                                               "never the model's top-1 (sampled)")
                      for p, c in cells])
    fig = go.Figure(go.Heatmap(z=z, y=list(range(length)), x=[r["name"] for r in rows], text=text,
                               texttemplate="%{text}", textfont=dict(size=14), customdata=hover,
                               hovertemplate="%{x}, %{customdata}<extra></extra>", xgap=4, ygap=1,
                               zmin=0, zmax=max(n_layers - 1, 1), colorscale="Viridis_r",
                               colorbar=dict(title="layer", thickness=12)))
    if first is not None:
        fig.add_hrect(y0=first - 0.5, y1=first + 0.5, line=dict(color="#ffb300", width=3))
    fig.update_yaxes(title="generated token (the boxed one is the first divergence)",
                     autorange="reversed", dtick=1 if length <= 40 else 5)
    fig.update_xaxes(side="top")
    return layout(fig, "Commitment: the layer from which each token stays the top choice",
                  height=160 + 24 * max(length, 1))


def top_candidates(full: list[tuple[str, float]], other: list[tuple[str, float]],
                   other_name: str, chosen: tuple[str, str] | None = None) -> go.Figure:
    """The top-k next tokens of both models at one step, side by side, with probabilities."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("full model", other_name),
                        horizontal_spacing=0.18)
    for col, (cands, colour) in enumerate(((full, FULL), (other, POP)), start=1):
        labels = [f"{_short(t, 20)!r}" for t, _ in cands][::-1]
        probs = [p for _, p in cands][::-1]
        picked = chosen[col - 1] if chosen else None
        colours = [DECODE if picked is not None and t == picked else colour for t, _ in cands][::-1]
        fig.add_trace(go.Bar(x=probs, y=labels, orientation="h", marker_color=colours,
                             text=[f"{p:.1%}" for p in probs], textposition="auto",
                             hovertemplate="%{y}: %{x:.2%}<extra></extra>", showlegend=False),
                      row=1, col=col)
        fig.update_xaxes(range=[0, 1], tickformat=".0%", title="probability", row=1, col=col)
    return layout(fig, "Top next-token candidates at the first divergent step (orange = the "
                        "token each model chose)", height=320)


def _short(piece: str, width: int = 8) -> str:
    p = piece.replace("\n", "⏎")
    return p if len(p) <= width else p[: width - 1] + "…"


def arrival_chart(series: dict) -> go.Figure:
    """Decode pace: seconds since each run's own first token at which its later tokens arrived.
    The first token's time is the timing protocol's business (a streamed run is one sample, with
    call counters on), so it is not drawn here: the lines start together and should run parallel,
    both models decoding with every layer."""
    fig = go.Figure()
    for name, times in series.items():
        rel = [t - times[0] for t in times] if times else []
        fig.add_trace(go.Scatter(x=list(range(len(times))), y=rel, mode="lines+markers", name=name,
                                 line=dict(color=FULL if name == "full" else POP)))
    fig.update_xaxes(title="generated token")
    fig.update_yaxes(title="seconds since the first token", rangemode="tozero")
    return layout(fig, "Decode pace: when each streamed token arrived after the first", height=300)
