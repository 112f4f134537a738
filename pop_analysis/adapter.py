"""The one module that knows Hugging Face internals.

Everything else in POP Lab drives a decoder through a `DecoderAdapter`: embed tokens, compute
rotary embeddings, run one layer in full, or project one layer's K/V alone (POP's independent KV
projection). transformers renames keywords between minor releases, so the names live here only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

# Keyword names of the pinned transformers range (see requirements.txt).
CACHE_KWARG = "past_key_values"
POS_EMB_KWARG = "position_embeddings"

# model_type -> family. Families share a layer layout; k_norm is detected per model.
SUPPORTED_FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
}


class UnsupportedArchitecture(ValueError):
    """The model's architecture has no adapter."""


def check_supported(config) -> None:
    """Raise a readable error for a config whose architecture POP Lab cannot drive."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_FAMILIES:
        arch = ", ".join(getattr(config, "architectures", None) or [str(model_type)])
        raise UnsupportedArchitecture(
            f"unsupported architecture {arch} (model_type {model_type!r}); "
            f"supported: {', '.join(sorted(SUPPORTED_FAMILIES))}"
        )


@dataclass(frozen=True)
class Shape:
    """Sizes a FLOP count or a UI needs."""

    n_layers: int  # decoder layers
    hidden: int  # D, residual width
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # Dh
    intermediate: int  # FFN width
    vocab: int  # lm_head rows
    max_positions: int  # context window


class DecoderAdapter:
    """Drives a pre-norm decoder (Llama layout) layer by layer."""

    def __init__(self, model):
        check_supported(model.config)
        self.model = model
        self.config = model.config
        self.base = model.model  # the decoder without lm_head
        self.layers = list(self.base.layers)
        if not self.layers:
            raise ValueError("the model has no decoder layers")
        self.has_k_norm = hasattr(self.layers[0].self_attn, "k_norm")
        self.shape = self._shape()

    def _shape(self) -> Shape:
        c = self.config
        attn = self.layers[0].self_attn
        return Shape(
            n_layers=len(self.layers),
            hidden=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim=attn.head_dim,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            max_positions=getattr(c, "max_position_embeddings", 0) or 0,
        )

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return self.base.embed_tokens.weight.device

    # --- modules other code may hook (drift, gates, call counters) ---
    def attention(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn

    def ffn(self, i: int) -> torch.nn.Module:
        return self.layers[i].mlp

    def o_proj(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn.o_proj

    def k_proj(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn.k_proj

    def input_norm(self, i: int) -> torch.nn.Module:
        return self.layers[i].input_layernorm

    # --- the forward pieces ---
    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.base.embed_tokens(ids)  # (B, T, D)

    def positions(self, start: int, length: int, batch: int = 1) -> torch.Tensor:
        pos = torch.arange(start, start + length, device=self.device)  # (T,)
        return pos.unsqueeze(0).expand(batch, -1)  # (B, T)

    def rotary(self, h: torch.Tensor, pos: torch.Tensor):
        return self.base.rotary_emb(h, position_ids=pos)  # cos, sin: (B, T, Dh)

    def run_layer(self, i, h, pos, rope, cache, mask=None) -> torch.Tensor:
        """Layer i in full (attention + FFN); writes its K/V into `cache`. Returns (B, T, D)."""
        kwargs = {CACHE_KWARG: cache, POS_EMB_KWARG: rope}
        return self.layers[i](h, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)

    def project_kv(self, i: int, h: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """POP's independent KV projection of layer i: input norm -> k/v proj -> k_norm -> RoPE.

        Returns post-RoPE keys and values shaped as cached, (B, Hkv, T, Dh) each.
        """
        layer = self.layers[i]
        attn = layer.self_attn
        x = layer.input_layernorm(h)  # (B, T, D)
        heads = (*x.shape[:-1], -1, attn.head_dim)  # (B, T, Hkv, Dh)
        k = attn.k_proj(x).view(heads)  # (B, T, Hkv, Dh)
        if self.has_k_norm:
            k = attn.k_norm(k)
        k = k.transpose(1, 2)  # (B, Hkv, T, Dh)
        v = attn.v_proj(x).view(heads).transpose(1, 2)  # (B, Hkv, T, Dh)
        cos, sin = rope  # (B, T, Dh)
        k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)  # (B, Hkv, T, Dh)
        return k, v

    def write_kv(self, cache: DynamicCache, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        cache.update(k, v, i)

    def cached_kv(self, cache: DynamicCache, i: int):
        """Layer i's cached (keys, values), (B, Hkv, S, Dh); None when nothing was written."""
        if i >= len(cache.layers):
            return None
        layer = cache.layers[i]
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            return None
        return layer.keys, layer.values

    def cache_length(self, cache: DynamicCache, i: int) -> int:
        kv = self.cached_kv(cache, i)
        return 0 if kv is None else kv[0].shape[-2]

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head on the given positions: (B, T, D) -> (B, T, V)."""
        return self.model.lm_head(self.base.norm(h_last))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
