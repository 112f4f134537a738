"""Stage-aware precision in the engine: the int8 copies a run setting's precision runs, and the
per-layer plan of a configuration.

Per layer, the prompt x_1..x_{N-1} runs in one of three precisions:

    full   the layer in fp32 (the original weights)
    int8   the layer's int8 copy (int8.py: int8 weights, dynamic int8 activations)
    skip   POP: the layer's K/V projected from the incoming hidden state, attention and FFN left out

x_N (the boundary token) and every generated token run every layer in fp32 from the original
weights: decode is the full model's, given the cache the prompt left. `decode_int8` is the
baseline that quantises everything (uniform int8: prompt, x_N and decode through the int8 copies).
Which layers run in int8 is the run setting's `precision` (pop_vllm/precision.py), checked by its
one validator; what only the loaded model can refuse (no int8 kernel for its dtype or device) is
`check_available`.
"""
from __future__ import annotations

from dataclasses import dataclass

from pop_analysis.engine.int8 import int8_layers, unavailable_reason
from pop_analysis.engine.skipset import describe
from pop_vllm.precision import FP32, PRECISIONS, Precision, PrecisionError
from pop_vllm.run_setting import RunSetting

CODES = {"full": "F", "int8": "I", "skip": "S"}  # one letter per layer in labels and plans

__all__ = ["FP32", "Precision", "PrecisionError", "Configuration", "check_available", "label",
           "layer_plan", "plan_code", "twins", "decode_twins", "from_plan"]


def check_available(adapter, setting: RunSetting) -> None:
    """Refuse, in one line, int8 layers this model or device has no int8 path for."""
    if setting.precision.active:
        reason = unavailable_reason(adapter)
        if reason:
            raise PrecisionError(reason)


def label(precision: Precision) -> str:
    if not precision.int8:
        return "fp32"
    return f"int8 {describe(precision.int8)}" + (" (decode too)" if precision.decode_int8 else "")


def layer_plan(n_layers: int, setting: RunSetting) -> list[str]:
    """Per layer, its prompt precision: 'full', 'int8' or 'skip'."""
    skipped = set(setting.skip) if setting.pruned else set()
    int8 = set(setting.precision.int8)
    return ["skip" if i in skipped else "int8" if i in int8 else "full" for i in range(n_layers)]


def plan_code(plan) -> str:
    """['full', 'int8', 'skip'] -> 'FIS' (a compact label of a configuration)."""
    return "".join(CODES[p] for p in plan)


def twins(adapter, precision: Precision) -> dict:
    """The int8 copies the precision runs ({} for fp32)."""
    return int8_layers(adapter, precision.int8) if precision.active else {}


def decode_twins(adapter, precision: Precision) -> dict:
    """The int8 copies decode runs: only the uniform int8 baseline's; {} otherwise."""
    return twins(adapter, precision) if precision.decode_int8 else {}


@dataclass(frozen=True)
class Configuration:
    """One way to run the prompt, named, for a frontier of speed against quality."""

    name: str  # its label ("pop", "int8 prefill", "IIIFFS...")
    setting: RunSetting = RunSetting.full()  # its skip set, variant and int8 layers

    @property
    def variant(self) -> str:
        return str(self.setting.variant)

    @property
    def skip(self) -> tuple[int, ...]:
        return self.setting.skip

    @property
    def precision(self) -> Precision:
        return self.setting.precision

    def plan(self, n_layers: int) -> list[str]:
        return layer_plan(n_layers, self.setting)


def from_plan(name: str, plan) -> Configuration:
    """A configuration from per-layer precisions ('full' / 'int8' / 'skip')."""
    bad = sorted({p for p in plan} - set(PRECISIONS))
    if bad:
        raise PrecisionError(f"unknown layer precision(s) {', '.join(bad)}; use "
                             f"{', '.join(PRECISIONS)}")
    skip = tuple(i for i, p in enumerate(plan) if p == "skip")
    int8 = tuple(i for i, p in enumerate(plan) if p == "int8")
    return Configuration(name, RunSetting(skip, "pop" if skip else "full",
                                          precision=Precision(int8)))
