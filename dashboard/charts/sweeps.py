"""Sweep figures: speed against the ideals with IQR bars, quality with 95% error bars, ratio and
length sweeps beside the paper's numbers.

Pure plotly builders like charts.py."""
from __future__ import annotations

import plotly.graph_objects as go

from dashboard.charts.style import DECODE, FLAGGED, FULL, POP, layout

# ---------- sweeps ----------

def _trusted(r: dict) -> bool:
    """A row's speed is trusted only when the timing protocol said so (older rows: not)."""
    return bool(r.get("timing_trustworthy", False))


def speed_traces(fig: go.Figure, x: list, rows: list[dict]) -> go.Figure:
    """Measured speedup (median) with IQR error bars, both ideals, and flagged points ringed
    in red with the reason on hover."""
    y = [r["prefill_speedup"] for r in rows]
    ranges = [r.get("speedup_range") or [v, v] for r, v in zip(rows, y)]
    notes = [r.get("timing_note") or "" for r in rows]
    fig.add_trace(go.Scatter(
        x=x, y=y, name="measured (median, IQR bars)", mode="lines+markers",
        line=dict(color=POP), marker=dict(color=[POP if _trusted(r) else FLAGGED for r in rows]),
        error_y=dict(type="data", symmetric=False, array=[hi - v for (_, hi), v in zip(ranges, y)],
                     arrayminus=[v - lo for (lo, _), v in zip(ranges, y)], color=POP, thickness=1.2),
        customdata=[[lo, hi, r.get("timing_rounds", 0), n] for (lo, hi), r, n in
                    zip(ranges, rows, notes)],
        hovertemplate="%{y:.2f}× (IQR %{customdata[0]:.2f}–%{customdata[1]:.2f}, "
                      "%{customdata[2]} rounds)<br>%{customdata[3]}<extra></extra>"))
    bad = [i for i, r in enumerate(rows) if not _trusted(r)]
    if bad:
        fig.add_trace(go.Scatter(
            x=[x[i] for i in bad], y=[y[i] for i in bad], name="flagged: not trustworthy",
            mode="markers", marker=dict(symbol="circle-open", size=16, color=FLAGGED,
                                        line=dict(width=2)),
            text=[notes[i] or "not timed by the protocol" for i in bad],
            hovertemplate="flagged: %{text}<extra></extra>"))
    fig.add_trace(go.Scatter(x=x, y=[r.get("ideal_speedup") for r in rows], name="ideal (FLOPs)",
                             mode="lines", line=dict(color=POP, dash="dot")))
    if any(r.get("roofline_speedup") is not None for r in rows):
        fig.add_trace(go.Scatter(x=x, y=[r.get("roofline_speedup") for r in rows],
                                 name="ideal (roofline: FLOPs and bytes)", mode="lines",
                                 line=dict(color=FULL, dash="dashdot")))
    return fig


def quality_trace(x: list, rows: list[dict], quality: str, **kw) -> go.Scatter:
    """A quality metric with its 95% interval as error bars (none where n < 2)."""
    y = [r.get(quality) for r in rows]
    cis = [r.get(f"{quality}_ci") or [v, v] if v is not None else [0, 0] for r, v in zip(rows, y)]
    return go.Scatter(
        x=x, y=y, name=f"{quality} (95% interval)", mode="lines+markers", line=dict(color=DECODE),
        error_y=dict(type="data", symmetric=False, color=DECODE, thickness=1.2,
                     array=[hi - v if v is not None else 0 for (_, hi), v in zip(cis, y)],
                     arrayminus=[v - lo if v is not None else 0 for (lo, _), v in zip(cis, y)]),
        hovertemplate="%{y:.3f}<extra></extra>", **kw)


def quality_chart(rows: list[dict], quality: str) -> go.Figure:
    """One quality metric per variant with its 95% interval; the full model's value as a line."""
    fig = go.Figure(quality_trace([r["variant"] for r in rows], rows, quality))
    fig.data[0].mode = "markers"
    full = next((r.get(quality) for r in rows if r.get("variant") == "full"), None)
    if full is not None:
        fig.add_hline(y=full, line=dict(color=FULL, dash="dot"), annotation_text="full model")
    fig.update_yaxes(title=quality)
    return layout(fig, f"{quality} per variant (error bars: 95% intervals)", height=360)


def paired(rows: list[dict], quality: str) -> bool:
    """Whether the rows carry the metric's paired difference from the full model."""
    return any(r.get(f"{quality}_delta") is not None for r in rows)


def delta_trace(x: list, rows: list[dict], quality: str, **kw) -> go.Scatter:
    """variant − full on the same items, with the paired 95% interval (the full model: 0)."""
    y = [0.0 if r.get("variant") == "full" else r.get(f"{quality}_delta") for r in rows]
    cis = [r.get(f"{quality}_delta_ci") or [v, v] if v is not None else [0, 0]
           for r, v in zip(rows, y)]
    return go.Scatter(
        x=x, y=y, name=f"{quality}: variant − full (paired 95% interval)", mode="lines+markers",
        line=dict(color=DECODE, width=2.5), marker=dict(size=9),
        error_y=dict(type="data", symmetric=False, color=DECODE, thickness=2, width=6,
                     array=[hi - v if v is not None else 0 for (_, hi), v in zip(cis, y)],
                     arrayminus=[v - lo if v is not None else 0 for (lo, _), v in zip(cis, y)]),
        hovertemplate="%{y:+.3f}<extra></extra>", **kw)


def ratio_chart(rows: list[dict], quality: str, paper: dict | None = None) -> go.Figure:
    """Measured / ideal prefill speedup and a quality metric over skip ratios (+ paper's Table 4).
    Where the rows are paired with the full model the quality axis shows the paired difference
    (0 = no change), as the table beside it does; absolute values with unpaired intervals
    overlapped while the paired differences said "worse" at every ratio."""
    rows = sorted(rows, key=lambda r: r["skip_ratio"])
    x = [r["skip_ratio"] for r in rows]
    diff = paired(rows, quality)
    fig = speed_traces(go.Figure(), x, rows)
    fig.add_trace(delta_trace(x, rows, quality, yaxis="y2") if diff
                  else quality_trace(x, rows, quality, yaxis="y2"))
    if paper:
        fig.add_trace(go.Scatter(x=paper["ratio"], y=paper["speedup"], name="paper: speedup",
                                 mode="markers", marker=dict(symbol="x", color=POP, size=10)))
        if paper.get("quality"):
            q = paper["quality"]
            fig.add_trace(go.Scatter(x=paper["ratio"], y=[v - q[0] for v in q] if diff else q,
                                     yaxis="y2", name=f"paper: {paper.get('quality_name', 'accuracy')}"
                                     + (" − full" if diff else ""), mode="markers",
                                     marker=dict(symbol="x", color=DECODE, size=10)))
    title2 = f"{quality}: variant − full" if diff else quality
    fig.update_layout(yaxis=dict(title="prefill speedup (×)"),
                      yaxis2=dict(title=title2, overlaying="y", side="right", showgrid=False,
                                  zeroline=True, zerolinecolor=FULL, zerolinewidth=2))
    fig.update_xaxes(title="skip ratio", tickformat=".0%")
    return layout(fig, "Speed vs quality over skip ratios", height=440,
                  margin=dict(l=60, r=70, t=80, b=50))


def length_chart(rows: list[dict], paper: dict | None = None) -> go.Figure:
    """Measured prefill speedup vs prompt length (+ the paper's Table 2 rows)."""
    rows = sorted(rows, key=lambda r: r["length"])
    fig = speed_traces(go.Figure(), [r["length"] for r in rows], rows)
    for name, pts in (paper or {}).items():
        fig.add_trace(go.Scatter(x=pts["length"], y=pts["speedup"], name=f"paper: {name}",
                                 mode="lines+markers", line=dict(dash="dash")))
    fig.update_xaxes(title="prompt length (tokens)", type="log")
    fig.update_yaxes(title="prefill (TTFT) speedup (×)")
    return layout(fig, "Prefill speedup vs input length", height=380)
