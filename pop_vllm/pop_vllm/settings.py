"""POP settings of one engine, read from the model config's `pop` entry (pure: no vLLM).

Given through vLLM's hf_overrides, e.g.
    hf_overrides={"architectures": ["PopLlamaForCausalLM"], "pop": {"skip": [20, 21], "variant": "pop"}}
(`pop_vllm.overrides` builds that dict). An empty skip set or variant "full" is the stock model.
Variant pop_repair also names its fitted K/V maps: {"skip": [...], "variant": "pop_repair",
"repair": "/abs/path.safetensors"} (repair.py reads and checks them).
"""
from __future__ import annotations

import os
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
    "Gemma3ForCausalLM": "PopGemma3ForCausalLM",  # text-only Gemma-3 (sliding-window layers)
}


class PopSettingsError(ValueError):
    """POP settings the model or engine cannot take; the message is one line."""


# POP Lab's variant the plugin refuses, and why (docs/serving.md, "Variants").
NO_KV_REASON = ("variant pop_no_kv is not supported in vLLM: its skipped layers keep no prompt K/V, "
                "but every layer of a KV-cache group shares one block table and sequence length "
                "per request (vLLM 0.32 has no per-layer sequence lengths), and zero or unused K/V "
                "slots would change what x_N and decode attend to; use pop or pop_repair")


# A limit of vLLM 0.32's CPU backend, stock models too (gpu_model_runner allocates a later stage's
# receive buffers in its dummy run; the CPU worker's warm-up runs it only for compiled models).
EAGER_PIPELINE_REASON = ("pipeline parallel on vLLM 0.32's CPU backend runs in compiled mode only: "
                         "in eager mode a later stage never allocates the buffers it receives "
                         "hidden states in, and the first step fails")


@dataclass(frozen=True)
class PopSettings:
    skip: tuple[int, ...] = ()
    variant: str = "pop"
    repair: str | None = None  # pop_repair: absolute path of the maps' safetensors file

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
    unknown = sorted(set(raw) - {"skip", "variant", "repair"})
    if unknown:
        raise PopSettingsError(f"unknown pop setting(s) {', '.join(unknown)}; use skip, variant "
                               "and repair")
    return make(raw.get("skip", ()), raw.get("variant", "pop"), n_layers, raw.get("repair"))


def make(skip, variant, n_layers: int, repair=None) -> PopSettings:
    if variant == "pop_no_kv":
        raise PopSettingsError(NO_KV_REASON)
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
    return PopSettings(tuple(layers), variant, _repair_path(repair, variant, layers))


def _repair_path(repair, variant: str, layers) -> str | None:
    """The maps file of pop_repair (checked to exist; its contents are checked by repair.py)."""
    if variant != "pop_repair":
        if repair is not None:
            raise PopSettingsError(f"a repair maps file is used by variant pop_repair only, not "
                                   f"{variant}")
        return None
    if not layers:
        raise PopSettingsError("variant pop_repair needs a non-empty skip set")
    if not repair:
        raise PopSettingsError("variant pop_repair needs a repair maps file: pop settings "
                               "{'repair': '/abs/path/KEY.safetensors'}")
    if not isinstance(repair, str) or not os.path.isabs(repair):
        raise PopSettingsError(f"the repair maps file must be an absolute path, got {repair!r:.200}")
    if not os.path.isfile(repair):
        raise PopSettingsError(f"repair maps file {repair:.200} does not exist")
    return repair


def overrides(architecture: str, skip=(), variant: str = "pop", repair: str | None = None) -> dict:
    """hf_overrides selecting the POP variant of `architecture` with these settings."""
    if architecture not in ARCHITECTURES:
        raise PopSettingsError(f"architecture {architecture} is not supported by the POP plugin "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    pop = {"skip": sorted(int(i) for i in skip), "variant": variant}
    if repair is not None:
        pop["repair"] = str(repair)
    return {"architectures": [ARCHITECTURES[architecture]], "pop": pop}


def untested_backends_allowed() -> bool:
    """POP_VLLM_UNTESTED_BACKENDS=1 lets the plugin run on attention backends it was not tested with."""
    return os.environ.get("POP_VLLM_UNTESTED_BACKENDS") == "1"
