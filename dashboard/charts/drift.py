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

def drift_panels(drift: dict, skip, only_skipped: bool = True, y_range=None,
                 reference: dict | None = None, title: str = "Drift per layer, POP vs full") -> go.Figure:
    """One small panel per quantity (hidden, K, V, attention output): the mean cosine over tokens
    (solid), the lowest token (dotted), and the paper's value as a dashed line where it quotes
    one (reference: quantity -> (value, words)). Two lines a panel read at projector size."""
    from plotly.subplots import make_subplots

    n = len(drift["hidden_cos"])
    layers = sorted(skip) if only_skipped and skip else list(range(n))
    names = [COSINE_NAMES[q] for q in COSINES]
    fig = make_subplots(rows=1, cols=4, shared_yaxes=True, subplot_titles=names,
                        horizontal_spacing=0.03)
    for col, (q, colour) in enumerate(COSINES.items(), start=1):
        for suffix, dash, label in (("_cos", "solid", "mean over tokens"),
                                    ("_min", "dot", "lowest token")):
            vals = drift.get(f"{q}{suffix}")
            if vals is not None:
                fig.add_trace(go.Scatter(x=layers, y=[vals[i] for i in layers], mode="lines+markers",
                                         name=label, legendgroup=label, showlegend=col == 1,
                                         line=dict(color=colour if suffix == "_cos" else FULL,
                                                   dash=dash, width=2.5 if suffix == "_cos" else 1.5),
                                         marker=dict(size=5)), row=1, col=col)
        ref = (reference or {}).get(q)
        if ref is not None:
            fig.add_hline(y=ref[0], line=dict(color="#b00020", dash="dash", width=2), row=1, col=col,
                          annotation_text=f"paper {ref[0]:.2f}", annotation_position="bottom right")
    fig.update_xaxes(title="layer", dtick=2 if len(layers) > 12 else 1)
    fig.update_yaxes(tickformat=TICKS, range=y_range or drift_range(drift))
    fig.update_yaxes(title="cosine POP vs full", row=1, col=1)
    layout(fig, title, height=400)
    fig.update_layout(title_pad_b=40, margin_t=110)  # above the panels' own titles
    return fig


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


def healing_chart(res: dict, quantity: str = "v") -> go.Figure:
    """Drift while healing: layer x tokens out, 1 - cosine of the prompt rows' K or V to the full
    model's cache (a HealDrift as a dict); the horizon marked where the cache became exact."""
    z = [list(col) for col in zip(*res[quantity])]  # (layer, step)
    fig = go.Figure(go.Heatmap(z=z, x=res["tokens_out"], y=list(range(len(z))), colorscale="Reds",
                               zmin=0, colorbar=dict(title="1 - cos"),
                               hovertemplate="layer %{y}, %{x} tokens out: %{z:.4f}<extra></extra>"))
    if res.get("horizon") is not None:
        fig.add_vline(x=res["horizon"] + 0.5, line_dash="dash", line_color=FULL,
                      annotation_text=f"exact from token {res['horizon'] + 1}")
    fig.update_xaxes(title="tokens out (healing runs before each decode step)", dtick=1)
    fig.update_yaxes(title="layer", dtick=1 if len(z) <= 40 else 4)
    name = COSINE_NAMES["k" if quantity == "k" else "v"]
    return layout(fig, f"Drift of the prompt's {name} while healing", height=360)
