"""Tiny random decoders of the families the vLLM plugin serves, saved under cache/vllm_test/ for
the engine tests (seconds to build, an engine start that loads no real weights), with POP Lab's
own LoadedModel over the same weights as the reference."""
from __future__ import annotations

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config,
                          Qwen3Config)

from vllm_driver import ROOT

SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # vLLM's CPU attention: >= 32
             max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
             eos_token_id=None, pad_token_id=None, torch_dtype="float32")
# Per architecture: its config class and what it adds to SHAPE. Gemma-3: a 16-token window on
# layers 0, 1, 3, 4 (global 2 and 5), so prompts of a few dozen tokens cross it.
CONFIGS = {
    "LlamaForCausalLM": (LlamaConfig, {}),
    "Qwen2ForCausalLM": (Qwen2Config, {"use_sliding_window": False}),
    "Qwen3ForCausalLM": (Qwen3Config, {"use_sliding_window": False}),
    "Gemma3ForCausalLM": (Gemma3TextConfig, {
        "sliding_window": 16, "query_pre_attn_scalar": 32,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2}),
}


def tiny(arch: str, seed: int, name: str, **config):
    """(the HF model, its saved folder) for `arch`, random weights from `seed`."""
    cls, extra = CONFIGS[arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cls(**{**SHAPE, **extra, **config})).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # random init is near-uniform: no greedy ties
        for layer in model.model.layers:  # Qwen2's qkv bias, random so the bias path matters
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0, 0.05)
    folder = ROOT / "cache" / "vllm_test" / name
    model.save_pretrained(folder)
    return model, folder


def prompts(*lengths: int) -> list[list[int]]:
    """Random token-id prompts of these lengths (the same for every run)."""
    return [torch.randint(0, SHAPE["vocab_size"], (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in lengths]
