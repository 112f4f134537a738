"""How far a prompt cache drifts from the full model's: per layer, the cosine similarity of the
cached keys and values at the pruned prompt positions (x_1..x_{N-1}), averaged over positions.

It compares any two runs of one prompt (POP, int8 prompt layers, both), read from the caches they
leave, so it needs no hooks: 1.0 where a layer's cache is the full model's.
"""
from __future__ import annotations

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.inspection.drift import cosine


@torch.inference_mode()
def cache_cosine(adapter: DecoderAdapter, cache, ref_cache) -> dict[str, list[float]]:
    """{"k": per layer mean cosine, "v": ...} of `cache` against `ref_cache` (one prompt, B = 1),
    over every cached position but the last (x_N: computed in full by both)."""
    out: dict[str, list[float]] = {"k": [], "v": []}
    for i in range(adapter.n_layers):
        (k, v), (k0, v0) = adapter.cached_kv(cache, i), adapter.cached_kv(ref_cache, i)
        for name, a, b in (("k", k, k0), ("v", v, v0)):
            a, b = (_rows(x) for x in (a, b))  # (S-1, Hkv*Dh) each
            out[name].append(float(cosine(a, b).mean()) if len(a) else 1.0)
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(1, Hkv, S, Dh) -> one row per cached position but the last, (S-1, Hkv*Dh)."""
    return x[0, :, :-1].transpose(0, 1).reshape(x.shape[2] - 1, -1).float()
