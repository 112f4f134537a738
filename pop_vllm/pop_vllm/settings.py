"""POP settings of one engine, read from the model config's `pop` entry (pure: no vLLM).

Given through vLLM's hf_overrides, e.g.
    hf_overrides={"architectures": ["PopLlamaForCausalLM"], "pop": {"skip": [20, 21], "variant": "pop"}}
(`pop_vllm.overrides` builds that dict). An empty skip set or variant "full" is the stock model.
Variant pop_repair also names its fitted K/V maps: {"skip": [...], "variant": "pop_repair",
"repair": "/abs/path.safetensors"} (repair.py reads and checks them).
"""
from __future__ import annotations

import os

from .run_setting import RunSetting, SettingError, check_served

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


class PopSettingsError(SettingError):
    """An engine configuration the POP plugin cannot run with; the message is one line."""


# A limit of vLLM 0.32's CPU backend, stock models too (gpu_model_runner allocates a later stage's
# receive buffers in its dummy run; the CPU worker's warm-up runs it only for compiled models).
EAGER_PIPELINE_REASON = ("pipeline parallel on vLLM 0.32's CPU backend runs in compiled mode only: "
                         "in eager mode a later stage never allocates the buffers it receives "
                         "hidden states in, and the first step fails")


def engine_setting(raw, n_layers: int) -> RunSetting:
    """The `pop` entry of an engine's model config (or a switch request) -> a setting it serves."""
    return check_served(RunSetting.from_config(raw, n_layers))


def overrides(architecture: str, setting: RunSetting) -> dict:
    """hf_overrides selecting the POP variant of `architecture` with this setting."""
    if architecture not in ARCHITECTURES:
        raise PopSettingsError(f"architecture {architecture} is not supported by the POP plugin "
                               f"(supported: {', '.join(ARCHITECTURES)})")
    return {"architectures": [ARCHITECTURES[architecture]], "pop": setting.as_config()}


def untested_backends_allowed() -> bool:
    """POP_VLLM_UNTESTED_BACKENDS=1 lets the plugin run on attention backends it was not tested with."""
    return os.environ.get("POP_VLLM_UNTESTED_BACKENDS") == "1"
