"""Pure plotly figures of the Serve page's load tests (rows from pop_analysis.serving.bench)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from dashboard.charts.style import FLAGGED, FULL, POP, layout


def rate_label(row: dict) -> str:
    rate = row["request_rate"]
    return "all at once" if rate is None else f"{rate:g} req/s"


def latency_cdf(rows: list[dict], metric: str = "ttft_ms", title: str = "TTFT") -> go.Figure:
    """Empirical CDF of every request's latency (all rounds), full solid and POP dashed, one
    colour shade per request rate."""
    fig = go.Figure()
    for i, row in enumerate(rows):
        for side, colour, dash in (("full", FULL, "solid"), ("pop", POP, "dash")):
            xs = np.sort(row[f"requests_{side}"][metric])
            ys = np.arange(1, len(xs) + 1) / max(len(xs), 1)
            name = "full" if side == "full" else row["variant"]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, dash=dash,
                                     width=2 if i == 0 else 1.2), opacity=1 - 0.35 * i,
                                     name=f"{name} · {rate_label(row)}"))
    fig.update_xaxes(title=f"{title} per request (ms)")
    fig.update_yaxes(title="fraction of requests", range=[0, 1.02])
    return layout(fig, f"{title} distribution (every request of every round)")


def tpot_box(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for side, colour in (("full", FULL), ("pop", POP)):
        xs, ys = [], []
        for row in rows:
            vals = row[f"requests_{side}"]["tpot_ms"]
            xs += [rate_label(row)] * len(vals)
            ys += vals
        name = "full" if side == "full" else (rows[0]["variant"] if rows else "pop")
        fig.add_trace(go.Box(x=xs, y=ys, name=name, marker_color=colour, boxpoints="outliers"))
    fig.update_layout(boxmode="group")
    fig.update_yaxes(title="TPOT per request (ms)")
    return layout(fig, "Time per output token (after the first)")


def throughput_bars(rows: list[dict]) -> go.Figure:
    x = [rate_label(r) for r in rows]
    fig = go.Figure([go.Bar(x=x, y=[r["throughput_full"] for r in rows], name="full", marker_color=FULL),
                     go.Bar(x=x, y=[r["throughput_pop"] for r in rows],
                            name=rows[0]["variant"] if rows else "pop", marker_color=POP)])
    fig.update_yaxes(title="output tokens / s (median over rounds)")
    return layout(fig, "Throughput", barmode="group")


def speedup_chart(rows: list[dict]) -> go.Figure:
    """Median per-round ratio full/POP with its IQR for TTFT, TPOT and throughput; a ratio the
    timing protocol flagged is drawn hollow in red."""
    fig = go.Figure()
    for offset, label, symbol, colour, get in (
            (-0.15, "TTFT", "circle", POP, lambda r: r),
            (0.0, "TPOT", "square", "#1f77b4", lambda r: r["tpot_ratio"]),
            (0.15, "throughput", "diamond", "#9467bd", lambda r: r["throughput_ratio"])):
        x = [i + offset for i in range(len(rows))]  # the three ratios side by side per rate
        parts = [get(r) for r in rows]
        med = [p["speedup"] for p in parts]
        ok = [p["timing_trustworthy"] for p in parts]
        fig.add_trace(go.Scatter(
            x=x, y=med, mode="markers", name=label, hovertext=[p["timing_note"] or "" for p in parts],
            error_y=dict(type="data", symmetric=False, color=colour,
                         array=[p["speedup_range"][1] - m for p, m in zip(parts, med)],
                         arrayminus=[m - p["speedup_range"][0] for p, m in zip(parts, med)]),
            marker=dict(size=11, symbol=[symbol if o else f"{symbol}-open" for o in ok],
                        color=[colour if o else FLAGGED for o in ok])))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.update_xaxes(tickvals=list(range(len(rows))), ticktext=[rate_label(r) for r in rows],
                     range=[-0.5, len(rows) - 0.5])
    fig.update_yaxes(title="full / POP (>1: POP better)")
    return layout(fig, "Speedup under load (hollow red: flagged by the timing protocol)")
