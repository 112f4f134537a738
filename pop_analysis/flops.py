"""FLOP counts of the full and POP prefill paths, for the ideal speedup.

Matmul FLOPs only (2 per multiply-add); norms, RoPE and softmax are ignored, as is usual.
"""
from __future__ import annotations

from .adapter import Shape


def layer_flops(s: Shape, n_tokens: int, ctx_sum: int) -> float:
    """One full layer over n_tokens whose attention spans add up to ctx_sum keys."""
    dq, dkv = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    proj = 2 * n_tokens * s.hidden * (2 * dq + 2 * dkv)  # q, k, v, o
    ffn = 2 * n_tokens * 3 * s.hidden * s.intermediate  # gate, up, down
    attn = 2 * 2 * dq * ctx_sum  # scores and weighted sum
    return proj + ffn + attn


def kv_proj_flops(s: Shape, n_tokens: int) -> float:
    """POP's independent K/V projection of one skipped layer."""
    return 2 * n_tokens * s.hidden * 2 * s.n_kv_heads * s.head_dim


def full_prefill_flops(s: Shape, n: int) -> float:
    """All layers over the N prompt tokens (causal), plus lm_head for the last one."""
    return s.n_layers * layer_flops(s, n, n * (n + 1) // 2) + 2 * s.hidden * s.vocab


def pop_prefill_flops(s: Shape, n: int, skip) -> float:
    """Kept layers over x_1..x_{N-1}, K/V projections for skipped ones, then x_N in full."""
    k = len(skip)
    m = n - 1
    pruned = (s.n_layers - k) * layer_flops(s, m, m * (m + 1) // 2) + k * kv_proj_flops(s, m)
    boundary = s.n_layers * layer_flops(s, 1, n)
    return pruned + boundary + 2 * s.hidden * s.vocab


def ideal_speedup(s: Shape, n: int, skip) -> float:
    """Full prefill FLOPs / POP prefill FLOPs at prompt length n."""
    return full_prefill_flops(s, n) / pop_prefill_flops(s, n, skip)


def prefill_flop_share(s: Shape, n: int, skip) -> float:
    """Fraction of full prefill FLOPs that POP still spends."""
    return pop_prefill_flops(s, n, skip) / full_prefill_flops(s, n)
