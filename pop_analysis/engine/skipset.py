"""Skip sets as users write them: explicit layers ("20-29", "3,5,7"), a ratio (the last
round(ratio * L) layers, as in the paper) or a preset name.

This module reads text into layers; what a skip set may be is decided by the run setting's one
validator (`pop_vllm.run_setting.RunSetting.check`), whose refusals are the same from every input.
"""
from __future__ import annotations

from enum import StrEnum

from pop_vllm.ranges import RangeError, parse_ranges

# describe: imported for the many callers that label skip sets from here.
from pop_vllm.run_setting import RunSetting, SettingError, describe, out_of_range  # noqa: F401


class Preset(StrEnum):
    """Named skip sets of the paper's ablations (each a third of the layers)."""

    PAPER = "paper"  # the last third: POP
    SHALLOW = "shallow"  # the first third
    INTERLEAVED = "interleaved"  # every third layer from layer 2
    NONE = "none"  # the empty set


PRESETS = tuple(Preset)
MAX_LAYERS = 10_000  # bound for layer numbers parsed without a model (no model is deeper)


def parse_layers(text: str, n_layers: int | None = None) -> tuple[int, ...]:
    """'20-29' or '3,5,7-9' -> (3, 5, 7, 8, 9). Empty text is the empty set.

    Read by the plugin's one range reader (`pop_vllm.ranges`, core lists use it too): every
    number is checked against the layer count (MAX_LAYERS without a model) before a range is
    expanded, so '0-20000000' fails at once instead of building a list of twenty million.
    """
    beyond = None if n_layers is None else (  # the run setting's own line for layers past the model
        lambda a, b: out_of_range(f"{a}-{b}" if b > a else str(a), n_layers))
    try:
        return parse_ranges(text, MAX_LAYERS if n_layers is None else n_layers, "layer",
                            beyond=beyond)
    except RangeError as e:
        raise SettingError(str(e)) from None


def last_block(n_layers: int, ratio: float) -> tuple[int, ...]:
    """The deepest round(ratio * L) layers, the paper's contiguous tail."""
    if not 0.0 <= ratio < 1.0:
        raise SettingError(f"skip ratio must be in [0, 1), got {ratio}")
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
    raise SettingError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")


def resolve(n_layers: int, layers=None, ratio: float | None = None,
            preset_name: str | None = None) -> tuple[int, ...]:
    """One skip set from exactly one of explicit layers, a ratio or a preset."""
    given = [x is not None for x in (layers, ratio, preset_name)]
    if sum(given) > 1:
        raise SettingError("give explicit layers, a ratio or a preset, not several")
    if isinstance(layers, str):
        layers = parse_layers(layers, n_layers if n_layers > 0 else None)
    if ratio is not None:
        layers = last_block(n_layers, ratio)
    elif preset_name is not None:
        layers = preset(preset_name, n_layers)
    return RunSetting(layers or ()).check(n_layers).skip
