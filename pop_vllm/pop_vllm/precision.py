"""A run's prefill precision (pure: no torch, no vLLM): which layers run the prompt in int8.

Per layer, the prompt x_1..x_{N-1} runs in one of three precisions: full (fp32, the original
weights), int8 (the layer's int8 copy: int8 weights, dynamic int8 activations) or skip (POP). x_N
and every generated token run every layer in fp32: decode is the full model's given the cache.
`decode_int8` is the baseline that quantises everything (uniform int8: prompt, x_N and decode).
It is a field of the run setting (run_setting.py), whose one validator checks it with the skip
set and the variant.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SettingError

PRECISIONS = ("full", "int8", "skip")  # a layer's prompt precision
INT8_VARIANTS = ("full", "pop")  # the variants int8 layers combine with


class PrecisionError(SettingError):
    """A precision setting that cannot run; the message is one line."""


@dataclass(frozen=True)
class Precision:
    """Which layers run the prompt in int8 (hashable: a cache key can hold it)."""

    int8: tuple[int, ...] = ()  # layers whose prompt positions run their int8 copy, sorted
    decode_int8: bool = False  # baseline: x_N and decode through the int8 copies too

    def __post_init__(self):
        items = self.int8 if hasattr(self.int8, "__iter__") and not isinstance(self.int8, str) \
            else None
        if items is None or any(isinstance(i, bool) or not _integral(i) for i in items):
            raise PrecisionError(f"int8 must be a list of layer indices, got {self.int8!r:.80}")
        layers = tuple(sorted({int(i) for i in items}))
        if layers and layers[0] < 0:
            raise PrecisionError(f"int8 layer {layers[0]} out of range: layers are numbered "
                                 "from 0")
        object.__setattr__(self, "int8", layers)
        if not isinstance(self.decode_int8, bool):
            raise PrecisionError(f"decode_int8 must be true or false, got {self.decode_int8!r:.40}")
        if self.decode_int8 and not layers:
            raise PrecisionError("int8 decode (uniform int8) needs int8 layers")

    @property
    def active(self) -> bool:
        return bool(self.int8)

    def as_dict(self) -> dict:
        return {"int8": list(self.int8), "decode_int8": self.decode_int8}


FP32 = Precision()


def from_dict(raw: dict) -> Precision:
    """`Precision.as_dict`'s fields (a request, a stored record) -> a checked Precision."""
    unknown = sorted(set(map(str, raw)) - {"int8", "decode_int8"})
    if unknown:
        raise PrecisionError(f"unknown precision field(s) {', '.join(unknown)[:120]}; use int8 "
                             "and decode_int8")
    return Precision(tuple(raw.get("int8", ())), raw.get("decode_int8", False))


def _integral(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError, OverflowError):
        return False
