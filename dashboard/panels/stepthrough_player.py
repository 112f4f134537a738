"""The Step through page's player: the frame index (kept in the session and in the URL as
?step=k), the previous / play / next buttons (arrow keys and space press them, see
presenter.KEYS_JS), and one frame drawn from the recorded run: what ran, its FLOPs, the K/V it
wrote, its time on this machine, full and POP on one clock, the next-token candidates."""
from __future__ import annotations

import time

import streamlit as st

from dashboard.charts import stepthrough as step_charts
from dashboard.panels import presenter
from dashboard.session import state
from pop_analysis.engine.skipset import describe
from pop_analysis.inspection.step_frames import position_tokens

STEP = "step.i"  # 0-based frame shown
PLAYING = "step.playing"
MOVED = "step.moved_at"  # when the frame last changed (the player waits PLAY_S after it)
URL_READ = "step.url_read"
PLAY_S = 2.5  # seconds per frame while playing
GRID_PX, CLOCK_PX = 395, 235  # the presenter's view: both on one 1440x900 screen, under the buttons
# there: the legend beside the grids (not under them), every fifth layer named
GRID_LAYOUT = {"legend": dict(orientation="v", x=1.01, y=1, yanchor="top", font_size=16),
               "yaxis_dtick": 5, "margin_r": 200, "margin_b": 100}


def current(n_frames: int) -> int:
    """The frame to show: the link's ?step=k on the session's first visit, else the kept one."""
    ss = st.session_state
    if not ss.get(URL_READ):
        ss[URL_READ] = True
        try:
            ss[STEP] = int(st.query_params.get("step", "1")) - 1
        except ValueError:
            ss[STEP] = 0
    ss[STEP] = min(max(int(ss.get(STEP, 0)), 0), n_frames - 1)
    st.query_params["step"] = str(ss[STEP] + 1)
    return ss[STEP]


def _move(delta: int, n_frames: int) -> None:
    ss = st.session_state
    ss[STEP] = min(max(ss.get(STEP, 0) + delta, 0), n_frames - 1)
    ss[MOVED] = time.time()
    if delta and ss[STEP] == n_frames - 1:
        ss[PLAYING] = False


def _play(n_frames: int) -> None:
    ss = st.session_state
    ss[PLAYING] = not ss.get(PLAYING)
    if ss[PLAYING] and ss.get(STEP, 0) >= n_frames - 1:
        ss[STEP] = 0  # play from the start after the end
    ss[MOVED] = time.time()


def controls(i: int, n_frames: int, title: str) -> None:
    playing = st.session_state.get(PLAYING, False)
    c = st.columns([1, 1, 1, 5], vertical_alignment="center")
    c[0].button("◀ Previous", key="step-prev", on_click=_move, args=(-1, n_frames),
                disabled=i == 0, width="stretch", help="← key")
    c[1].button("❚❚ Pause" if playing else "▶ Play", key="step-play", on_click=_play,
                args=(n_frames,), width="stretch", help="space bar")
    c[2].button("Next ▶", key="step-next", on_click=_move, args=(1, n_frames), type="primary",
                disabled=i == n_frames - 1, width="stretch", help="→ key")
    c[3].markdown(f"**Step {i + 1} of {n_frames}: {title}**")
    if playing:
        _player(n_frames)


@st.fragment(run_every=0.5)
def _player(n_frames: int) -> None:
    """While playing: the next frame every PLAY_S seconds (the whole page redraws)."""
    ss = st.session_state
    if ss.get(PLAYING) and time.time() - ss.get(MOVED, 0) >= PLAY_S:
        _move(1, n_frames)
        st.rerun(scope="app")


def cells(step: dict) -> tuple[int, int, int]:
    """(layer x token cells run in full (fp32 or int8), cells that only projected K/V, K/V cells
    written)."""
    full = sum(len(p) for p in step["attention"]) + sum(len(p) for p in step.get("int8") or [])
    kv = sum(len(p) for p in step["kv"])
    return full, kv, full + kv


def frame(rec, f: dict) -> dict:
    """One frame: its explanation, the numbers of the step, the grid, the clock, the candidates.
    Returns the figures drawn (for the downloads)."""
    shown, beside = f["shown"], f["beside"]
    labels = step_charts.position_labels(rec.tokens, position_tokens(rec.steps))
    figures = {"grid": step_charts.step_grid(shown, f["earlier"], rec.n_layers, labels, f["title"]),
               "clock": step_charts.clock(rec.steps, shown, "a step of its run's median round"
                                          if "clock" in rec.ttft else "the step's median")}
    if state.presenting():  # the first screen of a projector: the grid and the clock
        presenter.plot(figures["grid"], key="step.grid", projector_height=GRID_PX, title=False,
                       projector_layout=GRID_LAYOUT)
        presenter.plot(figures["clock"], key="step.clock", projector_height=CLOCK_PX,
                       projector_layout={"margin_b": 60, "yaxis_tickfont_size": 15, "bargap": 0.25})
    st.caption(f["explain"])
    full, kv, written = cells(shown)
    m = st.columns(4)
    m[0].metric("Computed in this step", f"{full} + {kv} cells",
                "attention + FFN, K/V projection only", delta_color="off", delta_arrow="off")
    m[1].metric("FLOPs of this step", f"{shown['flops'] / rec.full_prefill_flops:.1%}",
                f"of the full prefill ({shown['flops'] / 1e6:.0f} MFLOP)", delta_color="off",
                delta_arrow="off")
    positions = sorted({q for part in ("attention", "kv", "int8") for row in shown.get(part) or []
                        for q in row})
    m[2].metric("K/V cells written", f"{written}", f"{len(positions)} position(s), each in every "
                "layer that ran on it", delta_color="off", delta_arrow="off")
    who = "POP" if shown["run"] == "pop" else "full"
    m[3].metric(f"Time on this machine ({who})", f"{shown['time_ms']:.0f} ms",
                f"{clock_name(rec)} of {len(shown['times_ms'])}" + (
                    f" · full: {beside['time_ms']:.0f} ms" if beside is not None else ""),
                delta_color="off", delta_arrow="off")
    if not state.presenting():
        presenter.plot(figures["grid"], key="step.grid")
        presenter.plot(figures["clock"], key="step.clock")
    speed_line(rec)
    if shown["top"]:
        pair = [beside, shown] if beside is not None and beside["top"] else [shown]
        names = {"full": "full model", "pop": "POP"}
        figures["candidates"] = step_charts.top_tokens(
            [(names[s["run"]], s["top"]) for s in pair], [s["token"][1] for s in pair])
        presenter.plot(figures["candidates"], key="step.top")
    return figures


def clock_name(rec) -> str:
    """What one bar is: a step of its run's median round (a record made before: the step's median)."""
    return "its run's median round" if "clock" in rec.ttft else "median"


def speed_line(rec) -> None:
    """One speed story: the first-token times the clock marks, their ratio by the timing protocol,
    a warning when the protocol flags it, and what the prompt's length allows."""
    t, n = rec.ttft, len(rec.tokens)
    if not t["trustworthy"]:
        st.warning(f"⚠ Speed flagged, not a figure to quote: {t['note']}. Record again when the "
                   "machine is quieter.")
    if "clock" in rec.ttft:
        bars = (f"The clock draws each model's median round (the round whose first token came at "
                f"the median time), so its dotted marks are these two medians.")
    else:
        bars = ("The bars are each step's median over the rounds (recorded before the clock drew "
                "the median round), so they need not add up to the medians above.")
    flag = "⚠ " if not t["trustworthy"] else ""
    st.caption(
        f"First token: full {t['full_ms']:.0f} ms, POP {t['pop_ms']:.0f} ms (medians of "
        f"{t['rounds']} rounds, full and POP back to back, order swapped each round). {bars} "
        f"Speedup {flag}{t['speedup']:.2f}× is the median of the per-round ratios (IQR "
        f"{t['low']:.2f}–{t['high']:.2f}×), which cancels drift between rounds; the ratio of the "
        f"two medians is {t['full_ms'] / t['pop_ms']:.2f}×. The FLOP ideal at {n} tokens is "
        f"{rec.ideal_speedup:.2f}×. " + length_line(rec))


def length_line(rec) -> str:
    """Why this prompt's length gains what it gains."""
    n = len(rec.tokens)
    shared = (f"the boundary step reads the weights of layers {describe(rec.skip_layers)} again for "
              "one token, and the embedding and lm_head cost the same in both")
    if n < 24:
        return (f"A prompt of {n} tokens gains little: {shared}; from about 30 tokens on POP's "
                "first token comes visibly earlier (the Sweeps page shows 512 tokens).")
    return (f"At {n} tokens the pruned layers' work outweighs what both share ({shared}), so POP's "
            "first token comes earlier; the Sweeps page shows the gain at 512 tokens.")
