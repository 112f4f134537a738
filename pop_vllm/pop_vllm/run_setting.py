"""The run setting: how one run treats the prompt, as one frozen, checked value (pure: no vLLM).

Every way in builds it once (the CLI's flags, a dashboard link or widget, an HTTP request to a
serving engine, the `pop` entry of an engine's model config) and every layer passes it on whole:
engine, quality, speed, inspection, serving and the plugin read their skip set and variant from
it, never from loose arguments. One validator (`RunSetting.check`) refuses what a model cannot
take, with the same line wherever the setting came from; what only an engine refuses (variants
vLLM cannot serve) is `check_served`.

To change what a setting means (a new option, a new rule), change this module: its fields, the
normalisation in `__post_init__` (checks that need no model) and `check` (checks against the
model); `as_config` / `from_config` carry it across processes.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from . import healing, precision
from .errors import SettingError
from .healing import NO_HEAL, Heal
from .precision import FP32, Precision
from .variants import NO_BOUNDARY, PREFILL_SKIP_MODE, SERVED, SkipMode, Variant

# What an engine cannot serve, and why (docs/serving.md, "Variants").
NO_KV_REASON = ("variant pop_no_kv is not supported in vLLM: its skipped layers keep no prompt K/V, "
                "but every layer of a KV-cache group shares one block table and sequence length "
                "per request (vLLM 0.32 has no per-layer sequence lengths), and zero or unused K/V "
                "slots would change what x_N and decode attend to; use pop or pop_repair")
STATIC_REASON = "variant static removes layers in decode too (it is not POP): vLLM serves it not"
HEAL_REASON = ("healing is not served by vLLM 0.32: its model runner places every scheduled token "
               "after the computed ones, so no step can recompute earlier positions "
               "(docs/serving.md, \"Self-healing POP in vLLM\")")
INT8_REASON = ("int8 prompt layers are not served by vLLM 0.32's CPU build: it has no online int8 "
               "for dense linears, only int8 checkpoints (docs/serving.md, \"An int8 prefill pool\")")
FIELDS = ("skip", "variant", "repair", "heal", "precision")  # the keys of `as_config`, in order


@dataclass(frozen=True)
class RunSetting:
    """Which layers POP prunes in prefill, and how (hashable: a cache key can hold it)."""

    skip: tuple[int, ...] = ()  # 0-indexed layers pruned in prefill, sorted and unique
    variant: Variant = Variant.POP  # what the skipped layers do (variants.py); full: nothing
    repair: str | None = None  # pop_repair's fitted K/V maps file (absolute path); else None
    heal: Heal = NO_HEAL  # self-healing after the first token (healing.py); none: plain POP
    precision: Precision = FP32  # layers whose prompt runs in int8 (precision.py); fp32: none

    def __post_init__(self):
        object.__setattr__(self, "skip", _layers(self.skip))
        object.__setattr__(self, "variant", _variant(self.variant))
        if not isinstance(self.heal, Heal):
            raise SettingError(f"heal must be a healing.Heal, got {type(self.heal).__name__}")
        if not isinstance(self.precision, Precision):
            raise SettingError(f"precision must be a precision.Precision, got "
                               f"{type(self.precision).__name__}")
        healing.check_variant(self.heal, self.variant)
        self._check_precision()
        if self.heal.active and self.precision.active:
            raise SettingError("healing re-runs the pruned layers in fp32 from the first skipped "
                               "one up; it does not take int8 prompt layers: choose one of them")
        if self.repair is not None:
            if self.variant != Variant.POP_REPAIR:
                raise SettingError(f"a repair maps file is used by variant pop_repair only, not "
                                   f"{self.variant}")
            if not isinstance(self.repair, str) or not os.path.isabs(self.repair):
                raise SettingError(f"the repair maps file must be an absolute path, got "
                                   f"{self.repair!r:.200}")
        if self.variant == Variant.POP_REPAIR and not self.skip:
            raise SettingError("variant pop_repair needs a non-empty skip set")

    @classmethod
    def full(cls) -> "RunSetting":
        """The unmodified model."""
        return cls((), Variant.FULL)

    def check(self, n_layers: int) -> "RunSetting":
        """The one validator against a model of `n_layers` layers; returns the setting itself."""
        if n_layers <= 0:
            raise SettingError("the model has no layers to skip")
        bad = [i for i in self.skip if i >= n_layers]
        if bad:
            raise SettingError(out_of_range(describe(bad), n_layers))
        if self.skip and len(self.skip) == n_layers:
            raise SettingError(f"cannot skip all {n_layers} layers: at least one must run in "
                               "prefill")
        bad = [i for i in self.precision.int8 if i >= n_layers]
        if bad:
            raise precision.PrecisionError(f"int8 {out_of_range(describe(bad), n_layers)}")
        if self.repair is not None and not os.path.isfile(self.repair):
            raise SettingError(f"repair maps file {self.repair:.200} does not exist")
        return self

    def _check_precision(self) -> None:
        """The rules int8 prompt layers keep with the variant and skip set (no model needed)."""
        p = self.precision
        if not p.active:
            return
        if self.variant not in precision.INT8_VARIANTS:
            raise precision.PrecisionError(f"int8 layers combine with variants "
                                           f"{' and '.join(precision.INT8_VARIANTS)}, not "
                                           f"{self.variant}")
        both = sorted(set(p.int8) & set(self.skip)) if self.variant == Variant.POP else []
        if both:
            raise precision.PrecisionError(f"layer(s) {describe(both)} both skipped and int8: a "
                                           "layer's prompt runs in one precision (full, int8 or "
                                           "skip)")
        if p.decode_int8 and self.variant != Variant.FULL:
            raise precision.PrecisionError("int8 decode (uniform int8) is a baseline of the full "
                                           "model: use variant full, no skip set")

    def replace(self, **changes) -> "RunSetting":
        """A copy with some fields changed, normalised and checked like a new one."""
        return dataclasses.replace(self, **changes)

    @property
    def pruned(self) -> bool:
        """Whether the skip set takes effect (a non-empty set and a variant other than full)."""
        return bool(self.skip) and self.variant != Variant.FULL

    @property
    def active(self) -> bool:
        """Whether any token takes a path other than the full model's (pruned or int8)."""
        return self.pruned or self.precision.active

    @property
    def skip_mode(self) -> SkipMode | None:
        """What the skipped layers do for a pruned prompt token (None: they run in full)."""
        return PREFILL_SKIP_MODE[self.variant]

    @property
    def boundary(self) -> bool:
        """Whether x_N takes the full stack apart from the rest of the prompt (POP's boundary)."""
        return self.variant not in NO_BOUNDARY

    @property
    def decode_drop(self) -> tuple[int, ...]:
        """Layers removed during decode: only the static variant removes any."""
        return self.skip if self.variant == Variant.STATIC else ()

    def first_skipped(self, n_layers: int) -> int:
        """The lowest pruned layer (n_layers: none)."""
        return min(self.skip) if self.pruned else n_layers

    def first_changed(self, n_layers: int) -> int:
        """The lowest layer whose prompt path differs from the full model's, pruned or int8
        (n_layers: none); below it every position computes what the full model does."""
        return min((*(self.skip if self.pruned else ()), *self.precision.int8), default=n_layers)

    def as_config(self) -> dict:
        """Plain JSON fields: the `pop` entry of an engine's config, a request body, a cache key."""
        out = {"skip": list(self.skip), "variant": str(self.variant), "repair": self.repair}
        if self.heal.active:  # a setting without healing reads as before (stored keys keep)
            out["heal"] = self.heal.as_dict()
        if self.precision.active:  # likewise without int8 layers
            out["precision"] = self.precision.as_dict()
        return out

    @classmethod
    def from_config(cls, raw, n_layers: int) -> "RunSetting":
        """`as_config`'s dict (from a model config, a request, a stored record) -> checked setting;
        None is the stock model."""
        if raw is None:
            return cls.full()
        if not isinstance(raw, dict):
            raise SettingError(f"pop settings must be a dict like {{'skip': [...], 'variant': "
                               f"'pop'}}, got {type(raw).__name__}")
        unknown = sorted(set(map(str, raw)) - set(FIELDS))
        if unknown:
            raise SettingError(f"unknown pop setting(s) {', '.join(unknown)[:200]}; use "
                               f"{', '.join(FIELDS)}")
        heal, prec = raw.get("heal") or {}, raw.get("precision") or {}
        for name, value in (("heal", heal), ("precision", prec)):
            if not isinstance(value, dict):
                raise SettingError(f"{name} must be a dict of its fields, got "
                                   f"{type(value).__name__}")
        return cls(raw.get("skip", ()), raw.get("variant", Variant.POP), raw.get("repair"),
                   healing.from_dict(heal), precision.from_dict(prec)).check(n_layers)


def check_served(setting: RunSetting) -> RunSetting:
    """What a vLLM engine with the POP plugin can serve, on top of `RunSetting.check`."""
    if setting.variant == Variant.POP_NO_KV:
        raise SettingError(NO_KV_REASON)
    if setting.variant not in SERVED:
        raise SettingError(STATIC_REASON)
    if setting.variant == Variant.POP_REPAIR and setting.repair is None:
        raise SettingError("variant pop_repair needs a repair maps file: pop settings "
                           "{'repair': '/abs/path/KEY.safetensors'}")
    if setting.heal.active:
        raise SettingError(HEAL_REASON)
    if setting.precision.active:
        raise SettingError(INT8_REASON)
    return setting


def out_of_range(bad: str, n_layers: int) -> str:
    """The refusal of layers beyond the model ("40-45"), one line wherever they were typed."""
    return f"layer(s) {bad[:80]} out of range: the model has layers 0..{n_layers - 1}"


def describe(layers) -> str:
    """(20, 21, ..., 29, 3) -> '3, 20-29' for labels and messages; 'none' for the empty set."""
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


def _layers(skip) -> tuple[int, ...]:
    """Any iterable of integer layer indices -> a sorted tuple without repeats."""
    if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
        raise SettingError(f"skip must be a list of layer indices, got {skip!r:.200}")
    items = list(skip)
    if any(isinstance(i, bool) or not _integral(i) for i in items):
        raise SettingError(f"skip must hold integer layer indices, got {items!r:.200}")
    out = tuple(sorted({int(i) for i in items}))
    if out and out[0] < 0:
        raise SettingError(f"layer {out[0]} out of range: layers are numbered from 0")
    return out


def _integral(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError, OverflowError):
        return False


def _variant(value) -> Variant:
    try:
        return Variant(value)
    except ValueError:
        raise SettingError(f"unknown variant {str(value)!r:.80}; choose from "
                           f"{', '.join(Variant)}") from None
