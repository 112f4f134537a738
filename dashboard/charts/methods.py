"""The Methods page's figures: every importance method's curve, their rank agreement, the
angular-distance triangle, quality against k per method, the budgeted search's candidates
(pure plotly, no streamlit, no model). Layers are 0-indexed on every axis."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from dashboard.charts.axes import TICKS
from dashboard.charts.style import FLAGGED, POP, layout, shade_layers

TAIL = "#000000"  # the tail baseline, always drawn, always black
PALETTE = qualitative.D3  # one colour per method or series, in order


def normalised(values) -> list[float]:
    """Min-max to [0, 1] (a constant series is all 0), so curves of any unit share an axis."""
    v = np.asarray(values, dtype=float)
    span = v.max() - v.min()
    return ((v - v.min()) / span if span > 0 else np.zeros_like(v)).tolist()


def curves_chart(series: dict, titles: dict, shown, skip=()) -> go.Figure:
    """Each chosen series min-max normalised on one chart; the legend toggles a curve, hover
    gives the raw value. series: key -> per-layer values; titles: key -> legend label."""
    fig = go.Figure()
    for j, key in enumerate(shown):
        raw = series[key]
        fig.add_trace(go.Scatter(
            x=list(range(len(raw))), y=normalised(raw), mode="lines+markers", name=titles.get(key, key),
            customdata=raw, line=dict(color=TAIL if key.startswith("tail") else PALETTE[j % len(PALETTE)],
                                      width=2.5 if key.startswith("dropone") else 1.6),
            hovertemplate="layer %{x}: %{customdata:.4g} (normalised %{y:.2f})<extra>"
                          + titles.get(key, key) + "</extra>"))
    shade_layers(fig, skip, "current skip set")
    fig.update_xaxes(title="layer (0-indexed)", dtick=1 if len(next(iter(series.values()), [])) <= 32 else None)
    fig.update_yaxes(title="importance, min-max normalised (larger = more important)", range=[-0.03, 1.03])
    return layout(fig, "Every method's per-layer importance", height=440)


def agreement_heatmap(agreement: dict, kind: str = "kendall") -> go.Figure:
    """Kendall's tau (or Spearman's rho) between every pair of series, its 95% interval on hover."""
    names = agreement["names"]
    z = [[np.nan if x is None else x for x in row] for row in agreement[kind]]
    ci = agreement[f"{kind}_ci"]
    text = [[("–" if c is None else f"{c[0]:.2f} to {c[1]:.2f}") for c in row] for row in ci]
    fig = go.Figure(go.Heatmap(z=z, x=names, y=names, zmin=-1, zmax=1, colorscale="RdBu",
                               reversescale=True, customdata=text, texttemplate="%{z:.2f}",
                               hovertemplate="%{y} vs %{x}: %{z:.3f} (95%: %{customdata})<extra></extra>",
                               colorbar=dict(title="τ" if kind == "kendall" else "ρ")))
    fig.update_yaxes(autorange="reversed")
    word = "Kendall τ" if kind == "kendall" else "Spearman ρ"
    return layout(fig, f"Rank agreement ({word}; n = {agreement['n']} prompts)",
                  height=max(420, 26 * len(names) + 160))


def triangle_heatmap(triangle) -> go.Figure:
    """Angular distance d(l, n) on the last prompt token: rows l (first block), columns n (span)."""
    L = len(triangle)
    z = np.full((L, L), np.nan)
    for l, row in enumerate(triangle):
        z[l, :len(row)] = [np.nan if x is None else x for x in row]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(1, L + 1)), y=list(range(L)), colorscale="Viridis",
                               hovertemplate="blocks %{y}..%{y}+%{x}-1: d = %{z:.3f}<extra></extra>",
                               colorbar=dict(title="d(l, n)")))
    fig.update_xaxes(title="span n (blocks)")
    fig.update_yaxes(title="first block l (0-indexed)")
    return layout(fig, "Angular distance arccos(cos(h_l, h_l+n)) / π, last prompt token", height=440)


def frontier_chart(rows: list[dict], shape: str, titles: dict) -> go.Figure:
    """ΔNLL against k, one line per method with 95% error bars; the tail in black, the random
    draws as a grey range. Each point carries its row index (customdata) for "use this set"."""
    fig = go.Figure()
    mine = [(i, r) for i, r in enumerate(rows) if r["shape"] == shape]
    methods = list(dict.fromkeys(r["method"] for _, r in mine))
    rand = [r for _, r in mine if r["method"] == "random"]
    if rand:
        ks = sorted({r["k"] for r in rand})
        lo = [min(r["continuation_nll_delta"] for r in rand if r["k"] == k) for k in ks]
        hi = [max(r["continuation_nll_delta"] for r in rand if r["k"] == k) for k in ks]
        fig.add_trace(go.Scatter(x=ks + ks[::-1], y=hi + lo[::-1], fill="toself", line_width=0,
                                 fillcolor="rgba(120,120,120,0.2)", name="random (range of draws)",
                                 hoverinfo="skip"))
    for j, m in enumerate(x for x in methods if x != "random"):
        pts = sorted(((i, r) for i, r in mine if r["method"] == m), key=lambda p: p[1]["k"])
        ys = [r["continuation_nll_delta"] for _, r in pts]
        ci = [r.get("continuation_nll_delta_ci") or [y, y] for (_, r), y in zip(pts, ys)]
        tail = m == "tail"
        fig.add_trace(go.Scatter(
            x=[r["k"] for _, r in pts], y=ys, mode="lines+markers", name=titles.get(m, m),
            customdata=[[i, r["set"]] for i, r in pts],
            error_y=dict(type="data", symmetric=False, array=[c[1] - y for c, y in zip(ci, ys)],
                         arrayminus=[y - c[0] for c, y in zip(ci, ys)]),
            line=dict(color=TAIL if tail else PALETTE[j % len(PALETTE)],
                      width=3 if tail else 1.5),
            hovertemplate="k = %{x}: ΔNLL %{y:.3f}, layers %{customdata[1]}<extra>"
                          + titles.get(m, m) + "</extra>"))
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.update_xaxes(title="layers skipped in prefill (k)", dtick=1)
    fig.update_yaxes(title="ΔNLL vs the full model (nats/token)", tickformat=TICKS)
    return layout(fig, f"Quality against k, {shape} sets (tail always drawn)", height=440)


def candidates_chart(candidates: list[dict], max_delta_nll: float | None, chosen) -> go.Figure:
    """Every set the budgeted search measured: ΔNLL with its 95% interval against k; the
    budget line; met in green, missed in red, the chosen set ringed."""
    fig = go.Figure()
    for meets, colour, name in ((True, POP, "meets the budget"), (False, FLAGGED, "misses it")):
        pts = [c for c in candidates if c["meets"] == meets]
        if not pts:
            continue
        ys = [c["continuation_nll_delta"] for c in pts]
        fig.add_trace(go.Scatter(
            x=[c["k"] for c in pts], y=ys, mode="markers", name=name, marker=dict(color=colour, size=9),
            customdata=[[c["set"], c["phase"]] for c in pts],
            error_y=dict(type="data", symmetric=False,
                         array=[c["continuation_nll_delta_ci"][1] - y for c, y in zip(pts, ys)],
                         arrayminus=[y - c["continuation_nll_delta_ci"][0] for c, y in zip(pts, ys)]),
            hovertemplate="k = %{x}: ΔNLL %{y:.3f}, layers %{customdata[0]} (%{customdata[1]})"
                          "<extra></extra>"))
    pick = [c for c in candidates if c["skip_layers"] == list(chosen)]
    if pick:
        fig.add_trace(go.Scatter(x=[pick[0]["k"]], y=[pick[0]["continuation_nll_delta"]],
                                 mode="markers", name="chosen",
                                 marker=dict(size=18, color="rgba(0,0,0,0)",
                                             line=dict(color=TAIL, width=2))))
    if max_delta_nll is not None:
        fig.add_hline(y=max_delta_nll, line=dict(color=FLAGGED, dash="dash"),
                      annotation_text="budget (upper bound must stay below)")
    fig.update_xaxes(title="layers skipped in prefill (k)", dtick=1)
    fig.update_yaxes(title="ΔNLL vs the full model (nats/token)", tickformat=TICKS)
    return layout(fig, "Every set the search measured", height=380)
