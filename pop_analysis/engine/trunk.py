"""The full model's trunk, shared exactly with pruned variants.

Below a variant's first skipped layer f, every position (prompt, boundary token, teacher-forced
continuation) sees the same inputs as in the full model, so it computes the same hidden states
and K/V. The batched evaluation therefore runs layers 0..f-1 once per item with the full model,
keeps the hidden states entering layer f, and runs each variant only from layer f up; before a
variant decodes freely, its cache borrows layers 0..f-1 from the full model's prompt cache.
Sliding-window caches keep a window of their own, so models with them run every layer instead.
"""
from __future__ import annotations

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.pop import FirstStep, LayerPlan, _embed, padding, prompt_above, run_layers
from pop_vllm.run_setting import RunSetting


def shareable(adapter: DecoderAdapter) -> bool:
    return all(w is None for w in adapter.windows)


def start_layer(adapter: DecoderAdapter, setting: RunSetting) -> int:
    """The first layer a setting must run itself (0: nothing to share); int8 prompt layers
    count as changed ones, and uniform int8 shares nothing (x_N and decode change too)."""
    if not setting.active or not shareable(adapter) or setting.precision.decode_int8:
        return 0
    return setting.first_changed(adapter.n_layers)


@torch.inference_mode()
def full_chunk(adapter: DecoderAdapter, ids, cache, start: int = 0, attention_mask=None,
               capture=()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The full model over a chunk at positions start..: its output (B, T, D) and the hidden
    states entering each layer in `capture`, {layer: (B, T, D)}."""
    pad = padding(attention_mask, ids.shape[0], start + ids.shape[1])  # (B, start+T) or None
    h, pos = _embed(adapter, ids, start, pad)  # (B, T, D), (B, T)
    kept, done = {}, 0
    for f in sorted(set(capture)):
        h = run_layers(adapter, h, pos, cache, pad, range(done, f))  # (B, T, D)
        kept[f], done = h, f
    return run_layers(adapter, h, pos, cache, pad, range(done, adapter.n_layers)), kept


@torch.inference_mode()
def prompt_from(adapter: DecoderAdapter, h, start: int, setting: RunSetting,
                attention_mask=None) -> FirstStep:
    """`run_prompt` from the full model's hidden states entering layer `start` (B, N, D); the
    cache holds layers start.. only (see `borrow_lower`)."""
    b, n = h.shape[:2]
    pad = padding(attention_mask, b, n)  # (B, N) or None
    cache = adapter.new_cache()
    logits = prompt_above(adapter, h, pad, cache, setting, start)
    return FirstStep(logits, cache, n, attention_mask)


@torch.inference_mode()
def continue_from(adapter: DecoderAdapter, h, start: int, cache, position: int, drop=(),
                  attention_mask=None) -> torch.Tensor:
    """`teacher_force` from the full model's hidden states entering layer `start` (B, T, D);
    float logits (B, T, V)."""
    b, t = h.shape[:2]
    pad = padding(attention_mask, b, position + t)  # (B, position+T) or None
    pos = adapter.positions(position, t, b, pad)  # (B, T)
    h = run_layers(adapter, h, pos, cache, pad, range(start, adapter.n_layers),
                   LayerPlan.dropping(drop))  # (B, T, D)
    return adapter.logits(h).float()  # (B, T, V)


def borrow_lower(adapter: DecoderAdapter, cache, full_cache, start: int) -> None:
    """Give `cache` the full model's K/V of layers 0..start-1 (identical for the variant)."""
    for i in range(start):
        k, v = adapter.cached_kv(full_cache, i)  # (B, Hkv, S, Dh) each
        adapter.write_kv(cache, i, k, v)
