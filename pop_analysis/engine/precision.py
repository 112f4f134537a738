"""Stage-aware precision: which layers run the prompt in int8.

Per layer, the prompt x_1..x_{N-1} runs in one of three precisions:

    full   the layer in fp32 (the original weights)
    int8   the layer's int8 copy (int8.py: int8 weights, dynamic int8 activations)
    skip   POP: the layer's K/V projected from the incoming hidden state, attention and FFN left out

x_N (the boundary token) and every generated token run every layer in fp32 from the original
weights: decode is the full model's, given the cache the prompt left. `decode_int8` is the
baseline that quantises everything (uniform int8: prompt, x_N and decode through the int8 copies).
"""
from __future__ import annotations

from dataclasses import dataclass

from pop_analysis.engine.int8 import int8_layers, unavailable_reason
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_vllm.run_setting import RunSetting

PRECISIONS = ("full", "int8", "skip")  # a layer's prompt precision
CODES = {"full": "F", "int8": "I", "skip": "S"}  # one letter per layer in labels and plans
INT8_VARIANTS = ("full", "pop")  # the variants int8 layers combine with


class PrecisionError(InputError):
    """A precision setting that cannot run; the message is one line."""


@dataclass(frozen=True)
class Precision:
    """Which layers run the prompt in int8 (hashable: a cache key can hold it)."""

    int8: tuple[int, ...] = ()  # layers whose prompt positions run their int8 copy, sorted
    decode_int8: bool = False  # baseline: x_N and decode through the int8 copies too

    def __post_init__(self):
        try:
            layers = tuple(sorted({int(i) for i in self.int8}))
        except (TypeError, ValueError):
            raise PrecisionError(f"int8 must be a list of layer indices, got {self.int8!r:.80}") \
                from None
        object.__setattr__(self, "int8", layers)
        if self.decode_int8 and not layers:
            raise PrecisionError("int8 decode (uniform int8) needs int8 layers")

    @property
    def active(self) -> bool:
        return bool(self.int8)

    def label(self) -> str:
        if not self.int8:
            return "fp32"
        return f"int8 {describe(self.int8)}" + (" (decode too)" if self.decode_int8 else "")


FP32 = Precision()


def check(adapter, variant: str, skip, precision: Precision | None) -> None:
    """Refuse, in one line, a precision this model, variant and skip set cannot run."""
    if precision is None or not precision.active:
        return
    n = adapter.n_layers
    bad = [i for i in precision.int8 if not 0 <= i < n]
    if bad:
        raise PrecisionError(f"int8 layer(s) {describe(bad)} out of range: the model has layers "
                             f"0..{n - 1}")
    if variant not in INT8_VARIANTS:
        raise PrecisionError(f"int8 layers combine with variants {' and '.join(INT8_VARIANTS)}, "
                             f"not {variant}")
    both = sorted(set(precision.int8) & set(skip)) if variant == "pop" else []
    if both:
        raise PrecisionError(f"layer(s) {describe(both)} both skipped and int8: a layer's prompt "
                             "runs in one precision (full, int8 or skip)")
    if precision.decode_int8 and variant != "full":
        raise PrecisionError("int8 decode (uniform int8) is a baseline of the full model: use "
                             "variant full, no skip set")
    reason = unavailable_reason(adapter)
    if reason:
        raise PrecisionError(reason)


def layer_plan(n_layers: int, variant: str, skip, precision: Precision | None) -> list[str]:
    """Per layer, its prompt precision: 'full', 'int8' or 'skip'."""
    skipped = set(skip) if variant not in ("full",) else set()
    int8 = set(precision.int8) if precision else set()
    return ["skip" if i in skipped else "int8" if i in int8 else "full" for i in range(n_layers)]


def plan_code(plan) -> str:
    """['full', 'int8', 'skip'] -> 'FIS' (a compact label of a configuration)."""
    return "".join(CODES[p] for p in plan)


def twins(adapter, precision: Precision | None) -> dict:
    """The int8 copies the precision runs ({} for fp32)."""
    return int8_layers(adapter, precision.int8) if precision and precision.active else {}


def decode_twins(adapter, precision: Precision | None) -> dict:
    """The int8 copies decode runs: only the uniform int8 baseline's; {} otherwise."""
    return twins(adapter, precision) if precision and precision.decode_int8 else {}


@dataclass(frozen=True)
class Configuration:
    """One way to run the prompt, for a frontier of speed against quality."""

    name: str  # its label ("pop", "int8 prefill", "IIIFFS...")
    variant: str = "full"  # the pop.py variant (full or pop)
    skip: tuple[int, ...] = ()  # layers pop skips in prefill
    precision: Precision = FP32  # layers whose prompt runs in int8

    def plan(self, n_layers: int) -> list[str]:
        return layer_plan(n_layers, self.variant, self.skip, self.precision)

    @property
    def setting(self) -> RunSetting:
        """Its skip set and variant as the engine takes them."""
        return RunSetting(self.skip, self.variant)


def from_plan(name: str, plan) -> Configuration:
    """A configuration from per-layer precisions ('full' / 'int8' / 'skip')."""
    bad = sorted({p for p in plan} - set(PRECISIONS))
    if bad:
        raise PrecisionError(f"unknown layer precision(s) {', '.join(bad)}; use "
                             f"{', '.join(PRECISIONS)}")
    skip = tuple(i for i, p in enumerate(plan) if p == "skip")
    int8 = tuple(i for i, p in enumerate(plan) if p == "int8")
    return Configuration(name, "pop" if skip else "full", skip, Precision(int8))
