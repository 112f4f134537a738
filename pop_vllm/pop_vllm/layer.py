"""One skipped decoder layer in a POP step: pruned tokens write K/V and pass through, full tokens
run the whole layer.

Works on vLLM's Llama-family decoder layers (Llama, Mistral, Qwen2, Qwen3): input_layernorm,
self_attn (qkv_proj, optional q_norm/k_norm, rotary_emb, attn, o_proj), post_attention_layernorm,
mlp, with vLLM's (hidden, residual) pair whose sum is the residual stream; and on Gemma-3's, which
add two norms (each branch's output is normed before it joins the residual: `_branches`).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TokenSplit:
    """Which of one step's flattened tokens run the full layers, and how those attend: built
    once per step and handed whole to every pruned layer (or the compiled block)."""

    full_idx: torch.Tensor  # (F,) flattened indices of the full tokens, ascending
    pruned_idx: torch.Tensor  # (T-F,) the others (pruned tokens and padding), ascending
    ctx: Any  # vLLM's forward context of the step (its slot mapping and attention metadata)
    full_metadata: Callable[[], dict]  # the full tokens' attention metadata (built on first use)


class KVProjection(torch.nn.Module):
    """The K/V rows of a layer's qkv_proj, multiplied with the kernel vLLM picks for its own CPU
    linears (oneDNN with a prepacked weight here; plain F.linear elsewhere)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)  # (2 kv, D)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.cpu_linear = F.linear
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(self, remove_weight=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cpu_linear(x, self.weight, self.bias)  # (T, 2 kv)


def copy_kv_weights(layer) -> None:
    """Keep the K/V rows of qkv_proj: on CPU vLLM repacks linear weights after loading and
    empties `.weight`, and pruned tokens need K/V only (a third of the qkv matmul here).
    Kept off the module tree (object.__setattr__) so vLLM's loaders never see extra weights."""
    a = layer.self_attn
    w = a.qkv_proj.weight  # (q + 2 kv, D) on this rank
    b = getattr(a.qkv_proj, "bias", None)
    proj = KVProjection(w[a.q_size:].detach().clone(),
                        None if b is None else b[a.q_size:].detach().clone())
    object.__setattr__(a, "pop_kv", proj)


def _qk_norm(a, x: torch.Tensor, norm) -> torch.Tensor:
    """Per-head RMSNorm (Qwen3, Qwen2 with qk_norm); x: (T, heads * head_dim)."""
    t = x.shape[0]
    return norm(x.reshape(t, -1, a.head_dim)).reshape(t, -1)


def _uses_qk_norm(a) -> bool:
    return bool(getattr(a, "qk_norm", hasattr(a, "k_norm")))


@contextmanager
def swapped(ctx, **fields):
    """vLLM's forward context with these fields (attn_metadata, slot_mapping) replaced for the
    block, restored after it: the attention ops read them from there, not from arguments."""
    saved = {name: getattr(ctx, name) for name in fields}
    for name, value in fields.items():
        setattr(ctx, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ctx, name, value)


def write_kv(attn, k, v) -> None:
    """Write K/V (T, kv) of every token of the step into the layer's paged cache, at the step's
    slots: the same call vLLM's Attention.forward makes before attending."""
    from vllm.model_executor.layers.attention import attention as vattn

    k = k.view(-1, attn.num_kv_heads, attn.head_size)  # (T, Hkv, Dh)
    v = v.reshape(-1, attn.num_kv_heads, attn.head_size_v)  # (T, Hkv, Dh)
    vattn.unified_kv_cache_update(k, v, attn.layer_name)


def project_pruned_kv(a, h_pruned, pos_pruned, kv_proj=None):
    """K (normed where the family norms K, rotated) and V (P, kv) each of pruned tokens from their
    input-normed hidden states h_pruned (P, D) at positions pos_pruned (P,); kv_proj: their K/V
    projection (pop_repair's fitted map; default the layer's own K/V rows)."""
    kv = (a.pop_kv if kv_proj is None else kv_proj)(h_pruned)  # (P, 2 kv)
    k, v = kv.split([a.kv_size, a.kv_size], dim=-1)
    if _uses_qk_norm(a):
        k = _qk_norm(a, k, a.k_norm)
    k = k.contiguous()  # rotated in place
    k, _ = a.rotary_emb(pos_pruned, k, None)
    return k, v


def _branches(layer, o, residual):
    """The rest of the layer after o_proj, as its own forward does it: o (F, D) the attention
    output, residual (F, D) x_l; returns (hidden, residual) (F, D) each."""
    if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma: each branch normed, then added
        h, residual = layer.pre_feedforward_layernorm(layer.post_attention_layernorm(o), residual)
        return layer.post_feedforward_layernorm(layer.mlp(h)), residual
    h, residual = layer.post_attention_layernorm(o, residual)
    return layer.mlp(h), residual


def pruned_layer(layer, positions, hidden, residual, tokens: TokenSplit, kv_proj=None):
    """hidden, residual: (T, D) each (residual None before the first layer); tokens: the step's
    full/pruned split; kv_proj: the pruned tokens' K/V projection (pop_repair's fitted map;
    default the layer's own K/V rows). Returns the layer's (hidden, residual)."""
    full_idx, pruned_idx = tokens.full_idx, tokens.pruned_idx
    if residual is None:
        residual = hidden
        h = layer.input_layernorm(hidden)  # (T, D)
    else:
        h, residual = layer.input_layernorm(hidden, residual)  # (T, D), (T, D) = x_l
    a = layer.self_attn
    n = h.shape[0]
    k_pruned, v_pruned = project_pruned_kv(a, h.index_select(0, pruned_idx),
                                           positions.index_select(0, pruned_idx),
                                           kv_proj)  # (T-F, kv) each
    if full_idx.numel() == 0:  # a chunk from the middle of prompts: K/V only, pass through
        write_kv(a.attn, k_pruned, v_pruned)  # pruned_idx is every token here, in order
        return torch.zeros_like(residual), residual
    h_full = h.index_select(0, full_idx)  # (F, D)
    qkv, _ = a.qkv_proj(h_full)  # (F, q + 2 kv)
    q, k_full, v_full = qkv.split([a.q_size, a.kv_size, a.kv_size], dim=-1)
    if _uses_qk_norm(a):
        q, k_full = _qk_norm(a, q, a.q_norm), _qk_norm(a, k_full, a.k_norm)
    q, k_full = a.rotary_emb(positions.index_select(0, full_idx), q, k_full)
    k = h.new_empty((n, a.kv_size)).index_copy_(0, full_idx, k_full).index_copy_(0, pruned_idx, k_pruned)
    v = h.new_empty((n, a.kv_size)).index_copy_(0, full_idx, v_full).index_copy_(0, pruned_idx, v_pruned)
    # K/V go to the paged cache for every token (the step's slot mapping); attention runs for
    # the full tokens only, under metadata the backend's builder made for them.
    write_kv(a.attn, k, v)
    with swapped(tokens.ctx, attn_metadata=tokens.full_metadata()):
        o = a.attn(q, None, None)  # (F, heads * head_dim); None: K/V are written already
    o, _ = a.o_proj(o)  # (F, D)
    h_out, r_out = _branches(layer, o, residual.index_select(0, full_idx))  # (F, D) each
    # Pruned tokens leave the layer unchanged: hidden 0, residual x_l (the next norm adds them).
    hidden = torch.zeros_like(residual).index_copy_(0, full_idx, h_out)  # (T, D)
    residual = residual.clone().index_copy_(0, full_idx, r_out)  # (T, D)
    return hidden, residual
