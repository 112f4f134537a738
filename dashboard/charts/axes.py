"""Honest axes for the figure builders: log axes that show zeros instead of diving off the
chart, linear ranges that do not blow a flat line up into a cliff, readable tick labels."""
from __future__ import annotations

import math

TICKS = ".3~g"  # three significant digits, no trailing zeros: 0.141, not 0.14079
FLOOR_MARK = "triangle-down"  # marker of a value drawn at the log floor


def finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def log_floor(*series, decades: float = 1.0) -> float | None:
    """A floor for a log axis: `decades` below the smallest positive value of all series (None
    when no value is positive)."""
    pos = [v for s in series for v in finite(s) if v > 0]
    return min(pos) / 10 ** decades if pos else None


def clip_to_floor(values, floor: float | None) -> tuple[list, list[int]]:
    """Values at or below zero raised to `floor` (log axes cannot draw them); returns the new
    values and the indices that were raised, so the chart can mark and explain them."""
    if floor is None:
        return list(values), []
    out, raised = [], []
    for i, v in enumerate(values):
        if v is not None and math.isfinite(float(v)) and float(v) <= floor:
            out.append(floor)
            raised.append(i)
        else:
            out.append(v)
    return out, raised


def padded_range(values, min_span_rel: float = 0.2, pad_rel: float = 0.1,
                 lower: float | None = None, upper: float | None = None) -> list[float] | None:
    """A y range that shows the data with some air, and never spans less than `min_span_rel`
    of the values' size: a KL of 0.1408 +- 0.0001 then reads as flat, which it is.
    `lower` / `upper` clamp the range (0 for quantities that cannot be negative)."""
    vals = finite(values)
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    size = max(abs(lo), abs(hi), 1e-12)
    span = max(hi - lo, min_span_rel * size)
    mid = (lo + hi) / 2
    lo, hi = mid - span / 2 * (1 + 2 * pad_rel), mid + span / 2 * (1 + 2 * pad_rel)
    if lower is not None:
        lo = max(lo, lower)
    if upper is not None:
        hi = min(hi, upper)
    return [lo, hi]
