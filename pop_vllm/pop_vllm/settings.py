"""POP settings of one engine, read from the model config's `pop` entry (pure: no vLLM).

Given through vLLM's hf_overrides, e.g.
    hf_overrides={"architectures": ["PopLlamaForCausalLM"], "pop": {"skip": [20, 21], "variant": "pop"}}
(`pop_vllm.overrides` builds that dict). An empty skip set or variant "full" is the stock model.
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import VARIANTS, check_variant

SUPPORTED_VLLM = "0.32.0"
TESTED_BACKENDS = ("CPU_ATTN",)  # attention backends the plugin was tested with
# Stock architecture -> the registered POP variant of it.
ARCHITECTURES = {
    "LlamaForCausalLM": "PopLlamaForCausalLM",
    "MistralForCausalLM": "PopMistralForCausalLM",
    "Qwen2ForCausalLM": "PopQwen2ForCausalLM",
    "Qwen3ForCausalLM": "PopQwen3ForCausalLM",
}


class PopSettingsError(ValueError):
    """POP settings the model or engine cannot take; the message is one line."""


@dataclass(frozen=True)
class PopSettings:
    skip: tuple[int, ...] = ()
    variant: str = "pop"

    @property
    def active(self) -> bool:
        return bool(self.skip) and self.variant != "full"


def parse(raw, n_layers: int) -> PopSettings:
    """The `pop` entry of the config (dict or None) -> checked settings."""
    if raw is None:
        return PopSettings()
    if not isinstance(raw, dict):
        raise PopSettingsError(f"pop settings must be a dict like {{'skip': [...], 'variant': 'pop'}}, "
                               f"got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"skip", "variant"})
    if unknown:
        raise PopSettingsError(f"unknown pop setting(s) {', '.join(unknown)}; use skip and variant")
    return make(raw.get("skip", ()), raw.get("variant", "pop"), n_layers)


def make(skip, variant, n_layers: int) -> PopSettings:
    if variant not in VARIANTS:
        raise PopSettingsError(f"unknown POP variant {variant!r}; choose from {', '.join(VARIANTS)}")
    check_variant(variant)
    if isinstance(skip, (str, bytes)) or not hasattr(skip, "__iter__"):
        raise PopSettingsError(f"skip must be a list of layer indices, got {skip!r}")
    try:
        layers = sorted({int(i) for i in skip})
    except (TypeError, ValueError):
        raise PopSettingsError(f"skip must be a list of layer indices, got {skip!r}") from None
    if any(isinstance(i, bool) or (isinstance(i, float) and not float(i).is_integer())
           for i in skip):
        raise PopSettingsError(f"skip must hold integer layer indices, got {skip!r}")
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise PopSettingsError(f"skip layer(s) {', '.join(map(str, bad))} out of range: the model has "
                               f"{n_layers} layers (0..{n_layers - 1})")
    return PopSettings(tuple(layers), variant)


def overrides(architecture: str, skip=(), variant: str = "pop") -> dict:
    """hf_overrides selecting the POP variant of `architecture` with these settings."""
    if architecture not in ARCHITECTURES:
        raise PopSettingsError(f"architecture {architecture} is not supported by the POP plugin "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    return {"architectures": [ARCHITECTURES[architecture]],
            "pop": {"skip": sorted(int(i) for i in skip), "variant": variant}}
