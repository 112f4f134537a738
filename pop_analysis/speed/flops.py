"""FLOP counts of the full and POP prefill paths, for the FLOP ideal speedup.

Matmul FLOPs only (2 per multiply-add); norms, RoPE and softmax are ignored, as is usual. The
counts are sums over roofline.prefill_ops, the one description of what each path does (the
roofline module adds bytes moved, for the roofline ideal).
"""
from __future__ import annotations

from pop_analysis.engine.adapter import Shape
from pop_analysis.speed.roofline import kv_only_ops, layer_ops, prefill_ops, total_flops
from pop_vllm.run_setting import RunSetting


def layer_flops(s: Shape, n_tokens: int, ctx_sum: int) -> float:
    """One full layer over n_tokens whose attention spans add up to ctx_sum keys."""
    return total_flops(layer_ops(s, 0, n_tokens, ctx_sum, n_tokens))


def kv_proj_flops(s: Shape, n_tokens: int) -> float:
    """POP's independent K/V projection of one skipped layer."""
    return total_flops(kv_only_ops(s, 0, n_tokens))


def full_prefill_flops(s: Shape, n: int) -> float:
    """All layers over the N prompt tokens (causal), plus lm_head for the last one."""
    return total_flops(prefill_ops(s, n))


def pop_prefill_flops(s: Shape, n: int, setting: RunSetting) -> float:
    """POP: the trunk below the first skipped layer over all N tokens, the pruned rest over
    x_1..x_{N-1} (K/V projections for skipped layers), then x_N through the rest in full."""
    return total_flops(prefill_ops(s, n, setting))


def ideal_speedup(s: Shape, n: int, setting: RunSetting) -> float:
    """Full prefill FLOPs / the setting's prefill FLOPs at prompt length n."""
    return full_prefill_flops(s, n) / pop_prefill_flops(s, n, setting)


def prefill_flop_share(s: Shape, n: int, setting: RunSetting) -> float:
    """Fraction of full prefill FLOPs that the setting still spends."""
    return pop_prefill_flops(s, n, setting) / full_prefill_flops(s, n)
