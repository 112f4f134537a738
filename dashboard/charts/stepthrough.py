"""The step-through's figures: what each layer ran on each position in one step beside the KV
cache it left, full and POP on one clock, and the next-token candidates (pure plotly).

Every cell comes from a recorded run (pop_analysis.inspection.stepthrough): the grid is the
step's logged positions, the cache the union of what the run's steps so far wrote.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts.style import DECODE, FULL, HEAL, INT8, POP, PREFILL, alpha, layout

# compute grid: not run in this step, attention + FFN, K/V projection only, the int8 layer
IDLE, RAN, KV, RAN8 = 0, 1, 2, 3
# cache grid: empty, written earlier (full layer / K/V projection), written in this step, and
# written by an int8 layer (earlier, now)
EMPTY, OLD_FULL, OLD_KV, NEW_FULL, NEW_KV, OLD_INT8, NEW_INT8 = 0, 1, 2, 3, 4, 5, 6
RAN_TEXT = {IDLE: "not run in this step", RAN: "attention + FFN",
            KV: "K/V projection only (h passes through)", RAN8: "attention + FFN in int8"}
CACHE_TEXT = {EMPTY: "empty", OLD_FULL: "K/V from the full layer (earlier step)",
              OLD_KV: "K/V from the projection alone (earlier step)",
              NEW_FULL: "written now by the full layer", NEW_KV: "written now by the projection alone",
              OLD_INT8: "K/V from the int8 layer (earlier step)",
              NEW_INT8: "written now by the int8 layer"}
RUN_COLOURS = {"prefill": PREFILL, "boundary": DECODE, "decode": FULL, "heal": HEAL}


def _scale(colours: list[str]) -> list[list]:
    """A discrete colour scale for integer codes 0..len-1."""
    k = len(colours)
    out = []
    for i, c in enumerate(colours):
        out += [[i / k, c], [(i + 1) / k, c]]
    return out


def position_labels(tokens: list[str], generated: list[str]) -> list[str]:
    """'x1 The' ... 'x_N and', then 'y1 Earth' ...: prompt positions, then generated ones."""
    n = len(tokens)
    names = [f"x{i + 1}" if i < n - 1 else "x_N" for i in range(n)]
    names += [f"y{j + 1}" for j in range(len(generated))]
    texts = [*tokens, *generated]
    return [f"{a} {_short(t)}" for a, t in zip(names, texts)]


def _short(piece: str, width: int = 9) -> str:
    p = piece.replace("\n", "⏎").strip() or "␣"
    return p if len(p) <= width else p[: width - 1] + "…"


def _paint(z: list[list[int]], step: dict, full: int, kv: int, int8: int) -> None:
    """Mark the step's cells: positions run in full as `full`, projected K/V alone as `kv`, run by
    an int8 layer as `int8` (steps recorded before int8 layers existed have none)."""
    ran8 = step.get("int8") or [[] for _ in z]
    for i, row in enumerate(z):
        for p in step["attention"][i]:
            row[p] = full
        for p in step["kv"][i]:
            row[p] = kv
        for p in ran8[i]:
            row[p] = int8


def compute_cells(step: dict, n_layers: int, width: int) -> list[list[int]]:
    z = [[IDLE] * width for _ in range(n_layers)]
    _paint(z, step, RAN, KV, RAN8)
    return z


def cache_cells(step: dict, earlier: list[dict], n_layers: int, width: int) -> list[list[int]]:
    """Every cell a K/V was written to, by the steps before (faint) and this one."""
    z = [[EMPTY] * width for _ in range(n_layers)]
    for e in earlier:
        _paint(z, e, OLD_FULL, OLD_KV, OLD_INT8)
    _paint(z, step, NEW_FULL, NEW_KV, NEW_INT8)
    return z


def step_grid(step: dict, earlier: list[dict], n_layers: int, labels: list[str],
              title: str) -> go.Figure:
    """Left: layers x positions, what ran in this step. Right: the KV cache after it."""
    width = len(labels)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.06, shared_yaxes=True,
                        subplot_titles=("What runs in this step", "KV cache after this step"))
    ran = compute_cells(step, n_layers, width)
    cache = cache_cells(step, earlier, n_layers, width)
    layers = list(range(n_layers))
    fig.add_trace(go.Heatmap(
        z=ran, x=labels, y=layers, zmin=-0.5, zmax=3.5, showscale=False, xgap=2, ygap=1,
        colorscale=_scale(["#f2f2f2", PREFILL, DECODE, INT8]),
        customdata=[[RAN_TEXT[v] for v in row] for row in ran],
        hovertemplate="layer %{y}, %{x}: %{customdata}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(
        z=cache, x=labels, y=layers, zmin=-0.5, zmax=6.5, showscale=False, xgap=2, ygap=1,
        colorscale=_scale(["#ffffff", alpha(PREFILL, 0.35), alpha(DECODE, 0.35), PREFILL, DECODE,
                           alpha(INT8, 0.35), INT8]),
        customdata=[[CACHE_TEXT[v] for v in row] for row in cache],
        hovertemplate="layer %{y}, %{x}: %{customdata}<extra></extra>"), row=1, col=2)
    legend = [("attention + FFN", PREFILL), ("K/V projection only", DECODE),
              ("written earlier (faint)", alpha(PREFILL, 0.35))]
    if any(RAN8 in row for row in ran) or any(OLD_INT8 in r or NEW_INT8 in r for r in cache):
        legend.insert(2, ("attention + FFN in int8", INT8))
    for name, colour in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=14, color=colour)))
    fig.update_xaxes(tickangle=-60, type="category",  # a 40-token prompt still gets every label
                     tickfont=dict(size=14 if width <= 20 else 12))
    fig.update_yaxes(title="layer", row=1, col=1, dtick=1 if n_layers <= 32 else 4)
    layout(fig, title, height=max(420, 18 * n_layers + 200), plot_bgcolor="white",
           legend=dict(orientation="h", y=-0.28))
    fig.update_layout(title_pad_b=40, margin_t=110)  # above the two grids' own titles
    return fig


def ttft_ms(steps: list[dict], run: str) -> float:
    """A run's time to its first token: its prompt steps (prefill, and POP's boundary)."""
    return sum(s["time_ms"] for s in steps if s["run"] == run and s["stage"] in ("prefill", "boundary"))


def clock(steps: list[dict], shown: dict, bars: str = "a step of its run's median round") -> go.Figure:
    """Full and POP on one clock: each step a bar from its start to its end (`bars` says which
    time: the steps of each run's median round, so the first-token marks are the median TTFTs);
    the shown step in full colour, the others faint; each run's first token marked."""
    fig = go.Figure()
    pop = "POP + healing" if any(s["stage"].startswith("heal") for s in steps) else "POP"
    names = {run: f"{label}<br>first token {ttft_ms(steps, run):.0f} ms"
             for run, label in (("full", "full model"), ("pop", pop))}
    for s in steps:
        kind = s["stage"].split()[0]
        here = s is shown or (s["stage"] == shown["stage"] and kind == "decode")
        colour = RUN_COLOURS[kind] if s["run"] == "full" or kind != "prefill" else POP
        fig.add_trace(go.Bar(
            y=[names[s["run"]]], x=[s["time_ms"]], base=[s["start_ms"]], orientation="h",
            marker=dict(color=colour, opacity=1.0 if here else 0.3,
                        line=dict(color="black" if here else "white", width=2 if here else 1)),
            text=[s["stage"]], textposition="inside", insidetextanchor="middle",
            hovertemplate=f"{s['run']}, {s['stage']}: %{{x:.0f}} ms from "
                          f"{s['start_ms']:.0f} ms<extra></extra>", showlegend=False))
    for run, row in (("full", 1), ("pop", 0)):  # rows from the bottom: POP, full model
        t = ttft_ms(steps, run)
        fig.add_shape(type="line", x0=t, x1=t, y0=row - 0.48, y1=row + 0.48,
                      line=dict(color="black", width=3, dash="dot"))
    fig.update_xaxes(title=f"milliseconds since the prompt went in (each bar: {bars})",
                     rangemode="tozero")
    fig.update_yaxes(categoryorder="array", categoryarray=[names["pop"], names["full"]])
    return layout(fig, "One clock for both models (dotted: the first token)", height=280,
                  barmode="overlay", margin=dict(l=170, r=20, t=80, b=50))


def top_tokens(sides: list[tuple[str, list]], chosen: list[str | None]) -> go.Figure:
    """The top-k next tokens of each side (name, [[id, text, prob], ...]) with probabilities;
    the token each picked in orange."""
    fig = make_subplots(rows=1, cols=len(sides), subplot_titles=[n for n, _ in sides],
                        horizontal_spacing=0.2)
    for col, ((name, top), pick) in enumerate(zip(sides, chosen), start=1):
        labels = [repr(_short(t, 16)) for _, t, _ in top][::-1]
        probs = [p for _, _, p in top][::-1]
        colours = [DECODE if t == pick else (FULL if name.startswith("full") else POP)
                   for _, t, _ in top][::-1]
        fig.add_trace(go.Bar(x=probs, y=labels, orientation="h", marker_color=colours,
                             text=[f"{p:.1%}" for p in probs], textposition="auto",
                             hovertemplate="%{y}: %{x:.2%}<extra></extra>", showlegend=False),
                      row=1, col=col)
        fig.update_xaxes(range=[0, 1], tickformat=".0%", row=1, col=col)
    layout(fig, "Next-token candidates (orange: the token picked)", height=320)
    fig.update_layout(title_pad_b=40, margin_t=110)  # above the panels' own titles
    return fig
