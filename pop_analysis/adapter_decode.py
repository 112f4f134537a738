"""The adapter's lean batched decode step (part of adapter.py, split off for size).

Calibration samples 64 tokens for a batch of prompts, one position per row per step, without
autograd or hooks. Through HF's decoder forward, each step of the embedded 30-layer model spends as
long in mask building, SDPA set-up, cache bookkeeping and dispatch as in its matmuls (16 rows:
4.4 ms per layer, 2.1 of them matmuls). This step runs the same Llama-layout layer (input norm ->
q/k/v -> q/k norm -> RoPE -> attention over the cache -> o -> residual -> norm -> gated MLP ->
residual) on the layer's own modules with a handful of tensor ops: the norms, projections and
rotary embedding are HF's own modules and formula, so those results are bit-identical; attention is
softmax(q K^T * scale + padding) V in plain matmuls, equal to HF's kernel to float rounding.

It applies only where that is the whole layer (`lean_decode_ok`): the Llama family, no sliding
window, one shared rotary embedding, a preallocated cache (adapter_cache), no hooks anywhere in the
decoder (gates, counters and recorders are hooks, so a hooked model takes HF's forward and they see
every layer) and autograd off. Only adapter.py imports this module.
"""
from __future__ import annotations

import torch

from .adapter_cache import PreallocatedLayer
from .fewrows import few_rows_linear


def lean_decode_ok(adapter, cache) -> bool:
    """Whether `decode_step` can take the lean path for this model and cache now."""
    if torch.is_grad_enabled() or adapter.family != "llama" or adapter._rope_keys[0] is not None:
        return False
    if any(w is not None for w in adapter.windows):
        return False
    if len(cache.layers) != adapter.n_layers or \
            not all(type(c) is PreallocatedLayer for c in cache.layers):
        return False
    if torch.nn.modules.module._global_forward_hooks or \
            torch.nn.modules.module._global_forward_pre_hooks:
        return False
    return not any(_hooked(m) for m in adapter.base.modules())


def _hooked(m: torch.nn.Module) -> bool:
    """Hooks, accelerate's device hook, or a replaced forward (few_rows' own is the same sum)."""
    if m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook"):
        return True
    return "forward" in vars(m) and type(m) is not torch.nn.Linear


def lean_decode(adapter, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                cache) -> torch.Tensor:
    """One decode position per row: ids (B, 1), mask (B, S) with 1 = real over cached + new
    positions, pos (B, 1). Appends each layer's K/V to `cache`; returns final-norm states (B, 1, D).
    """
    x = adapter.embed(ids)  # (B, 1, D)
    B = x.shape[0]
    cos, sin = adapter.rotary(x, pos)  # (B, 1, Dh) each
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, 1, Dh): broadcast over heads
    pad = torch.zeros(mask.shape, dtype=x.dtype, device=x.device)  # (B, S)
    pad = pad.masked_fill_(mask.to(x.device) == 0, float("-inf"))[:, None, None, :]  # (B,1,1,S)
    for i, layer in enumerate(adapter.layers):
        dev = adapter.layer_device(i)
        if x.device != dev:
            x, cos, sin, pad = x.to(dev), cos.to(dev), sin.to(dev), pad.to(dev)
        attn = layer.self_attn
        hd = attn.head_dim
        h = layer.input_layernorm(x)  # (B, 1, D)
        q = few_rows_linear(attn.q_proj, h).view(B, 1, -1, hd)  # (B, 1, H, Dh)
        k = few_rows_linear(attn.k_proj, h).view(B, 1, -1, hd)  # (B, 1, Hkv, Dh)
        v = few_rows_linear(attn.v_proj, h).view(B, 1, -1, hd).transpose(1, 2)  # (B, Hkv, 1, Dh)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, 1, Dh), (B, Hkv, 1, Dh)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = cache.layers[i].update(k, v)  # (B, Hkv, S, Dh) each
        hkv = keys.shape[1]
        # GQA: query head j reads kv head j // G, so the G heads of one kv head are adjacent.
        qg = q.reshape(B, hkv, -1, hd)  # (B, Hkv, G, Dh)
        scores = torch.matmul(qg, keys.transpose(-1, -2)) * attn.scaling + pad  # (B, Hkv, G, S)
        o = torch.matmul(torch.softmax(scores, dim=-1), values)  # (B, Hkv, G, Dh)
        x = x + few_rows_linear(attn.o_proj, o.reshape(B, 1, -1))  # (B, 1, D)
        h = layer.post_attention_layernorm(x)
        mlp = layer.mlp
        up = mlp.act_fn(few_rows_linear(mlp.gate_proj, h)) * few_rows_linear(mlp.up_proj, h)
        x = x + few_rows_linear(mlp.down_proj, up)  # (B, 1, D)
    return adapter.base.norm(x.to(adapter.base.norm.weight.device))  # (B, 1, D)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
