"""Prefill speed on the Generate page: the timing protocol on the prompt just generated from.

The streamed answers are for reading; their one-off TTFTs are not what the page reports. After
the stream (which has warmed both paths), `measure` runs pop_analysis.speed.timing's protocol on the
same prompt ids, taking the model's run lock once per round: a wait for another session is
never timed, and a contended lock flags the result. `show` draws median, range, rounds, both
ideals and the flag.
"""
from __future__ import annotations

import streamlit as st
import torch

from dashboard.session.resources import model_lock
from pop_analysis.engine.models import LoadedModel
from pop_analysis.speed.bench import PrefillSpeed, time_prefill
from pop_analysis.speed.timing import TimingConfig
from pop_vllm.run_setting import RunSetting

# At least 3 rounds, more while 2 s last; no warm-up (the stream just ran both paths).
PAGE_TIMING = TimingConfig(min_rounds=3, budget_s=2.0, warmup=0)


def measure(lm: LoadedModel, spec_key: tuple, prompt_ids: list[int], setting: RunSetting,
            where=None) -> PrefillSpeed:
    """The protocol on `prompt_ids`, with a progress note in `where` (removed when done)."""
    lock = model_lock(*spec_key)
    note = (where or st).empty()
    label = "Timing TTFT on this prompt: full and variant alternated, order swapped each round"

    def on_round(done: int, planned: int) -> None:
        note.progress(min(1.0, done / planned), text=f"{label} — round {done} of ~{planned}")

    note.progress(0.0, text=f"{label} ...")
    ids = torch.tensor([prompt_ids], device=lm.device)  # (1, N)
    try:
        return time_prefill(lm, ids, setting, PAGE_TIMING, lock=lock.hold,
                            on_round=on_round)
    finally:
        note.empty()


def flags(p: PrefillSpeed) -> list[str]:
    """Why the speedup is not a figure to quote: the protocol's reasons, and the median of the
    per-round ratios disagreeing with the ratio of the median TTFTs shown beside it."""
    t = p.timing
    out = list(t.reasons) if t.reasons else ([t.note] if t.note else [])
    return out + ([t.medians_disagree()] if t.medians_disagree() else [])


def headline(p: PrefillSpeed) -> str:
    """The speedup as shown: a flagged one never reads as a plain number."""
    return f"⚠ {p.speedup:.2f}×" if flags(p) else f"{p.speedup:.2f}×"


def show(p: PrefillSpeed, where=None, name: str = "variant") -> None:
    """Median TTFTs, the speedup with its range and rounds, both ideals, and the flag;
    `name` names the variant (a static run must not read as POP)."""
    where = where or st
    t = p.timing
    m = where.columns(4)
    m[0].metric("TTFT full (median)", f"{t.full_median_ms:.0f} ms")
    m[1].metric(f"TTFT {name} (median)", f"{t.variant_median_ms:.0f} ms")
    m[2].metric("Prefill speedup (flagged)" if flags(p) else "Prefill speedup", headline(p),
                f"IQR {t.low:.2f}–{t.high:.2f}× · {t.rounds} rounds", delta_color="off",
                delta_arrow="off", help=f"Median of the per-round ratios full / {name}; the "
                "delta line gives their interquartile range and the number of rounds.")
    m[3].metric("Ideal: FLOPs / roofline", f"{p.ideal_speedup:.2f}× / {p.roofline_speedup:.2f}×",
                f"measured = {p.speedup / p.ideal_speedup:.0%} / "
                f"{p.speedup / p.roofline_speedup:.0%} of them", delta_color="off",
                delta_arrow="off")
    where.caption(one_story(p, name))
    if flags(p):
        where.warning(f"Speed not trustworthy: {'; '.join(flags(p))}. Re-measure when the machine "
                      "is quieter.")
    where.caption(
        f"TTFT (prompt in → first token, boundary step included) from the timing protocol on this "
        f"prompt ({p.tokens} tokens): {t.rounds} rounds of full and variant, order swapped every "
        "round; the speedup is the median of the per-round ratios, the IQR the middle half of "
        "them. The FLOP ideal counts matmul work; the roofline ideal also counts bytes moved "
        "(weights, activations, K/V) at this machine's measured matmul rate and memory bandwidth."
        + (f" Waited {t.lock_wait_s:.1f} s for another session (not counted)." if t.lock_wait_s
           > 0.05 else ""))


def one_story(p: PrefillSpeed, name: str) -> str:
    """One line tying the headline to the figures beside it: the speedup is the median of the
    per-round ratios; the ratio of the two median TTFTs is said next to it, with a warning when
    the two tell different stories (noisy rounds)."""
    t = p.timing
    of_medians = t.full_median_ms / t.variant_median_ms
    text = (f"The speedup {p.speedup:.2f}× is the median of {t.rounds} per-round ratios (each "
            f"round times full and {name} back to back); the two median TTFTs above give "
            f"{of_medians:.2f}×.")
    if t.medians_disagree():
        text += (" ⚠ They disagree beyond the rounds' interquartile range: the rounds were "
                 "noisy, so neither is a measurement to quote.")
    if p.tokens < 64:
        text += (f" At {p.tokens} tokens the possible gain is small: the embedding, lm_head and the "
                 "boundary step's weight reads cost the same in both (the roofline ideal "
                 f"{p.roofline_speedup:.2f}× counts them).")
    if p.speedup > p.roofline_speedup * 1.1:
        text += (" Above the roofline ideal: that ideal assumes the work runs at this machine's "
                 "measured memory and matmul rates, and this run's layers ran slower than that, "
                 "so the shared memory-bound work weighs less than the roofline says; the FLOP "
                 f"ideal {p.ideal_speedup:.2f}× bounds it.")
    return text


def speed_text(row: dict) -> str:
    """A sweep row's speedup as the table shows it: a flagged one is marked."""
    v = row.get("prefill_speedup")
    if v is None or v != v:
        return "–"
    if _rounds(row) == 0 and row.get("timing_trustworthy") is True:
        return f"{v:.2f}× (reference)"
    return f"{v:.2f}×" if row.get("timing_trustworthy") is True else f"⚠ {v:.2f}×"


def _iqr_text(row: dict) -> str:
    rng = row.get("speedup_range")
    if not isinstance(rng, (list, tuple)) or len(rng) != 2 or not _rounds(row):
        return "–"  # the reference row, or a row stored before the protocol
    return f"{rng[0]:.2f}–{rng[1]:.2f}"


def _rounds(row: dict) -> int:
    n = row.get("timing_rounds")
    return int(n) if isinstance(n, (int, float)) and n == n else 0  # NaN: not in that row


SPEED_COLUMNS = ["prefill_speedup", "speedup_range", "timing_rounds", "timing_trustworthy",
                 "timing_note"]


def sweep_table(frame, kind: str):
    """The rows for display: the speedup (flagged ones marked), its IQR, rounds and the reason
    of a flag, both ideals beside it; the prompt length first in a length sweep."""
    rows = frame.to_dict("records")
    out = frame.drop(columns=[c for c in SPEED_COLUMNS if c in frame.columns])
    speed = {"prefill speedup": [speed_text(r) for r in rows],
             "IQR": [_iqr_text(r) for r in rows],
             "rounds": [_rounds(r) for r in rows]}
    ideals = [c for c in ("ideal_speedup", "roofline_speedup") if c in out.columns]
    speed.update({c: out.pop(c) for c in ideals})
    speed["timing note"] = [r.get("timing_note") if isinstance(r.get("timing_note"), str) else ""
                            for r in rows]  # NaN where pandas filled a None
    for i, (name, values) in enumerate(speed.items()):
        out.insert(i, name, list(values))
    lead = ["length"] if kind == "length" and "length" in out.columns else []
    lead += [c for c in ("variant", "skip_ratio") if c in out.columns]
    return out[lead + [c for c in out.columns if c not in lead]]
