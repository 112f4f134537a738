"""Skip-set suggestions from a calibration result: the paper's last third and adaptive sets.

The paper does not rank layers; it motivates the deep block from the importance curves. Adaptive
sets (the k layers, or the contiguous block, of lowest prefill importance, or every layer under a
threshold) are this project's extension; each comes with its ideal prefill speedup.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pop_analysis.engine.adapter import Shape
from pop_analysis.engine.skipset import preset
from pop_analysis.speed.flops import ideal_speedup
from pop_vllm.run_setting import RunSetting

SPEEDUP_LENGTH = 512  # prompt length at which suggestions quote their ideal speedup


@dataclass(frozen=True)
class Suggestion:
    """A skip set derived from a calibration result."""

    name: str  # "paper", "adaptive" or "threshold"
    layers: tuple[int, ...]  # 0-indexed, sorted
    ideal_speedup: float  # prefill FLOP ratio at SPEEDUP_LENGTH prompt tokens
    description: str  # one line for a label


def suggest_skip(result, n_skip: int | None = None,
                 contiguous_tail: bool = False,
                 threshold: float | None = None) -> dict[str, Suggestion]:
    """Skip sets from a result: "paper" (last third), "adaptive" (k lowest prefill importance,
    k defaulting to the paper's count) and, when a threshold is given, "threshold" (every layer
    whose prefill importance is below it; absolute, in the units of result.prefill).

    contiguous_tail keeps each set one contiguous block, so POP's independent K/V projections all
    read the same hidden state as in the paper: "adaptive" becomes the block of k layers with the
    lowest summed prefill importance, "threshold" the longest run of layers under the threshold
    that ends at the last layer. No set holds every layer.
    """
    L = result.n_layers
    imp = [float(x) for x in result.prefill]
    paper = preset("paper", L)
    k = len(paper) if n_skip is None else int(n_skip)
    if not 0 <= k < L:
        raise ValueError(f"n_skip must be in 0..{L - 1} for a {L}-layer model, got {k}")
    if contiguous_tail:
        adaptive, how = lowest_block(imp, k), f"the contiguous block of {k} layers"
    else:
        adaptive, how = lowest(imp, k), f"the {k} layers"
    out = {"paper": _suggestion(result, "paper", paper,
                                "last third of the layers (the paper's default)"),
           "adaptive": _suggestion(result, "adaptive", adaptive,
                                   f"{how} with the lowest prefill importance")}
    if threshold is not None:
        under = [i for i in range(L) if imp[i] < threshold]
        if contiguous_tail:
            under = _tail_run(under, L)
        if len(under) == L:  # at least one layer must run in prefill
            under.remove(max(under, key=lambda i: (imp[i], -i)))
        out["threshold"] = _suggestion(result, "threshold", under,
                                       f"layers with prefill importance below {threshold:g}")
    return out


def lowest(imp: list[float], k: int) -> list[int]:
    """The k lowest; among equal values the deeper layer first (POP prunes deep layers)."""
    return sorted(sorted(range(len(imp)), key=lambda i: (imp[i], -i))[:k])


def lowest_block(imp: list[float], k: int) -> list[int]:
    """The contiguous block of k layers with the lowest summed importance (ties: the deeper)."""
    if k == 0:
        return []
    starts = range(len(imp) - k + 1)
    best = min(starts, key=lambda s: (sum(imp[s:s + k]), -s))
    return list(range(best, best + k))


def _tail_run(layers: list[int], L: int) -> list[int]:
    chosen, i = set(layers), L - 1
    while i in chosen:
        i -= 1
    return list(range(i + 1, L))


def _suggestion(result, name: str, layers, description: str) -> Suggestion:
    layers = tuple(sorted(int(i) for i in layers))
    fields = dataclasses.fields(Shape)
    needed = {f.name for f in fields if f.default is dataclasses.MISSING}
    if result.shape and needed <= set(result.shape):  # older results lack the later fields
        given = {f.name: result.shape[f.name] for f in fields if f.name in result.shape}
        shape = Shape(**{**given, "windows": tuple(given.get("windows") or ())})
        speed = ideal_speedup(shape, SPEEDUP_LENGTH, RunSetting(layers))
    else:  # no usable shape stored: the layer-count ratio, as the paper quotes it
        speed = result.n_layers / (result.n_layers - len(layers))
    return Suggestion(name, layers, float(speed), description)
