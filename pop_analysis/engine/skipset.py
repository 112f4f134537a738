"""Skip sets: which layers POP prunes in prefill.

A skip set is a sorted tuple of 0-indexed layers. Users give explicit layers ("20-29", "3,5,7"),
a ratio (the last round(ratio * L) layers, as in the paper) or a preset name.
"""
from __future__ import annotations

from enum import StrEnum

from pop_analysis.errors import InputError
from pop_vllm.ranges import RangeError, parse_ranges


class Preset(StrEnum):
    """Named skip sets of the paper's ablations (each a third of the layers)."""

    PAPER = "paper"  # the last third: POP
    SHALLOW = "shallow"  # the first third
    INTERLEAVED = "interleaved"  # every third layer from layer 2
    NONE = "none"  # the empty set


PRESETS = tuple(Preset)
MAX_LAYERS = 10_000  # bound for layer numbers parsed without a model (no model is deeper)


class SkipSetError(InputError):
    """An impossible skip set; the message says why."""


def parse_layers(text: str, n_layers: int | None = None) -> tuple[int, ...]:
    """'20-29' or '3,5,7-9' -> (3, 5, 7, 8, 9). Empty text is the empty set.

    Read by the plugin's one range reader (`pop_vllm.ranges`, core lists use it too): every
    number is checked against the layer count (MAX_LAYERS without a model) before a range is
    expanded, so '0-20000000' fails at once instead of building a list of twenty million.
    """
    where = None if n_layers is None else f"the model has layers 0..{n_layers - 1}"
    try:
        return parse_ranges(text, MAX_LAYERS if n_layers is None else n_layers, "layer", where)
    except RangeError as e:
        raise SkipSetError(str(e)) from None


def last_block(n_layers: int, ratio: float) -> tuple[int, ...]:
    """The deepest round(ratio * L) layers, the paper's contiguous tail."""
    if not 0.0 <= ratio < 1.0:
        raise SkipSetError(f"skip ratio must be in [0, 1), got {ratio}")
    k = round(ratio * n_layers)
    return tuple(range(n_layers - k, n_layers))


def preset(name: str, n_layers: int) -> tuple[int, ...]:
    """Named skip sets used by the paper's ablations (each a third of the layers)."""
    third = round(n_layers / 3)
    if name == Preset.PAPER:
        return last_block(n_layers, 1 / 3)
    if name == Preset.SHALLOW:
        return tuple(range(third))
    if name == Preset.INTERLEAVED:
        return tuple(range(2, n_layers, 3))
    if name == Preset.NONE:
        return ()
    raise SkipSetError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")


def validate(layers, n_layers: int) -> tuple[int, ...]:
    """Check explicit layers against the model; return them sorted and unique."""
    if n_layers <= 0:
        raise SkipSetError("the model has no layers to skip")
    out = tuple(sorted(set(int(i) for i in layers)))
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise SkipSetError(f"layer(s) {bad} out of range: the model has layers 0..{n_layers - 1}")
    if len(out) == n_layers:
        raise SkipSetError(f"cannot skip all {n_layers} layers: at least one must run in prefill")
    return out


def resolve(n_layers: int, layers=None, ratio: float | None = None,
            preset_name: str | None = None) -> tuple[int, ...]:
    """One skip set from exactly one of explicit layers, a ratio or a preset."""
    given = [x is not None for x in (layers, ratio, preset_name)]
    if sum(given) > 1:
        raise SkipSetError("give explicit layers, a ratio or a preset, not several")
    if isinstance(layers, str):
        layers = parse_layers(layers, n_layers if n_layers > 0 else None)
    if ratio is not None:
        layers = last_block(n_layers, ratio)
    elif preset_name is not None:
        layers = preset(preset_name, n_layers)
    return validate(layers or (), n_layers)


def describe(layers) -> str:
    """(20, 21, ..., 29, 3) -> '3, 20-29' for labels."""
    layers = sorted(layers)
    if not layers:
        return "none"
    runs, start, prev = [], layers[0], layers[0]
    for i in layers[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if i is not None:
            start = prev = i
    return ", ".join(runs)
