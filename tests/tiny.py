"""Tiny randomly initialised models of each supported family, for invariant tests."""
from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from pop_analysis.engine.models import model_from_hf

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)

FAMILIES = {
    "llama": lambda: LlamaConfig(**COMMON),
    "mistral": lambda: MistralConfig(**COMMON, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**COMMON, use_sliding_window=False),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=16, use_sliding_window=False),
}
WINDOW = 8  # a sliding window shorter than the prompts the tests use
GEMMA = dict(COMMON, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16)
LOCAL_GLOBAL = ["sliding_attention", "sliding_attention", "full_attention"] * 2
# Families with sliding-window layers (kept apart: FAMILIES parametrises the invariant tests).
SLIDING_FAMILIES = {
    "mistral_sliding": lambda: MistralConfig(**COMMON, sliding_window=WINDOW),
    "gemma3_text": lambda: Gemma3TextConfig(**GEMMA, layer_types=LOCAL_GLOBAL),
}


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    """A LoadedModel around a random `family` model (fp32, CPU, eval)."""
    torch.manual_seed(seed)
    config = {**FAMILIES, **SLIDING_FAMILIES}[family]()
    for k, v in overrides.items():
        setattr(config, k, v)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).eval()
    # Random init is near-uniform; sharpen it so greedy choices are not ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model_from_hf(model, name=f"tiny-{family}")


def tiny_prompt(n: int = 12, seed: int = 1, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def forced_model(tokenizer, text: str = "7", name: str = "forced"):
    """A tiny model whose lm_head always picks the token of `text` (bias only, by a margin):
    known answers for metric and harness tests. Returns (LoadedModel, token id)."""
    (token,) = tokenizer(text, add_special_tokens=False)["input_ids"]
    tiny = tiny_model("llama", vocab_size=len(tokenizer))
    head = torch.nn.Linear(COMMON["hidden_size"], len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[token] = 30.0
    tiny.model.lm_head = head
    return model_from_hf(tiny.model, tokenizer, name=name), token


def saved(tmp_path, edit=None, **overrides):
    """A tiny llama saved as a local model folder; `edit(tensors)` changes its safetensors."""
    from safetensors.torch import load_file, save_file

    lm = tiny_model("llama", **overrides)
    folder = tmp_path / "model"
    lm.model.save_pretrained(folder)
    if edit is not None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})
    return folder


class CancelWhen:
    """A progress callback that asks for cancellation once `when(update)` is true."""

    def __init__(self, when):
        import threading

        self.cancel_event = threading.Event()
        self.when = when

    def __call__(self, update):
        if self.when(update):
            self.cancel_event.set()


def planted_model(identity=(1, 3), seed: int = 0):
    """A tiny Llama whose blocks `identity` add nothing to the residual stream (o_proj and
    down_proj zeroed): they still project K/V but pass the hidden state through unchanged."""
    lm = tiny_model("llama", seed=seed)
    with torch.no_grad():
        for i in identity:
            lm.adapter.o_proj(i).weight.zero_()
            lm.adapter.ffn(i).down_proj.weight.zero_()
    return lm
