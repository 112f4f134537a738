"""What a stored example's timings must show before it is shipped (the examples command refuses
anything else, and a unit test holds the shipped files to it): every ratio unflagged by the timing
protocol and within its margin of its ideal, and the step-through's clock with POP's first token
before the full model's. A flagged figure teaches whatever the machine was doing, not POP."""
from __future__ import annotations

from pop_analysis.speed.timing import Timing, TimingConfig

MARGIN = TimingConfig().ideal_margin  # the protocol's own margin above an ideal


def _ratio(where: str, speedup, ideal, trustworthy, note) -> list[str]:
    out = []
    if not trustworthy:
        out.append(f"{where}: {speedup:.2f}x flagged ({note})")
    if ideal is not None and speedup > ideal * (1 + MARGIN):
        out.append(f"{where}: {speedup:.2f}x is more than {MARGIN:.0%} above its ideal {ideal:.2f}x")
    return out


def stepthrough_problems(p: dict) -> list[str]:
    t = p["ttft"]
    out = _ratio("step-through TTFT", t["speedup"], p["ideal_speedup"], t["trustworthy"], t["note"])
    if not t["pop_ms"] < t["full_ms"]:
        out.append(f"step-through: POP's first token ({t['pop_ms']:.0f} ms) is not before the full "
                   f"model's ({t['full_ms']:.0f} ms) at {len(p['prompt_ids'])} tokens")
    ends = {run: max((s["start_ms"] + s["time_ms"] for s in p["steps"]
                      if s["run"] == run and s["stage"] in ("prefill", "boundary")), default=0.0)
            for run in ("full", "pop")}
    if not ends["pop"] < ends["full"]:
        out.append(f"step-through clock: POP's first token at {ends['pop']:.0f} ms, the full "
                   f"model's at {ends['full']:.0f} ms")
    return out


def generation_problems(p: dict) -> list[str]:
    speed = p.get("speed")
    if not speed:
        return ["generation: no speed measurement"]
    t = speed["timing"]
    where = f"generation TTFT at {speed['tokens']} tokens"
    split = Timing(**t).medians_disagree()  # the Generate page flags this too
    return _ratio(where, t["speedup"], speed["ideal_speedup"], t["trustworthy"], t["note"]) + (
        [f"{where}: {t['speedup']:.2f}x, but {split}"] if split else [])


def sweep_problems(p: dict) -> list[str]:
    out = []
    for row in p["rows"]:
        if row.get("timing_rounds"):  # the full model's own 1.0 is not timed
            out += _ratio(f"sweep {row['variant']} skip {row['skip_ratio']:g} at {row['length']} "
                          "tokens", row["prefill_speedup"], row["ideal_speedup"],
                          row["timing_trustworthy"], row["timing_note"])
    return out


CHECKS = {"stepthrough": stepthrough_problems, "heal_stepthrough": stepthrough_problems,
          "generation": generation_problems, "sweep": sweep_problems}


def problems(kind: str, payload: dict) -> list[str]:
    """One line per timing the example must not ship with ([] for kinds without timings)."""
    check = CHECKS.get(kind)
    return check(payload) if check else []
