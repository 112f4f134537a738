"""POP inference: pruned prefill with independent KV, boundary handling, full decode.

Prefill and decode are separate small functions with explicit positions; one cache object holds
every layer's K/V for the whole run. Variants (for the paper's ablations):

    full             every layer, every position (the unmodified model)
    pop              prefill x_1..x_{N-1}: skipped layers write independent K/V and pass h through;
                     x_N and all generated tokens run the full model
    pop_no_kv        as pop, but skipped layers write no K/V for prompt positions
    pop_no_boundary  as pop, but x_N also goes through the pruned prefill
    static           skipped layers removed in prefill AND decode (ShortGPT-style)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .adapter import DecoderAdapter

VARIANTS = ("full", "pop", "pop_no_kv", "pop_no_boundary", "static")

# How a layer in the skip set behaves during prefill, per variant.
_PREFILL_SKIP_MODE = {"full": None, "pop": "kv", "pop_no_kv": "drop", "pop_no_boundary": "kv",
                      "static": "drop"}


class PromptError(ValueError):
    """A prompt the model cannot take (empty, or longer than the context)."""


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")


def check_prompt(adapter: DecoderAdapter, n_prompt: int, max_new_tokens: int = 0) -> None:
    if n_prompt < 1:
        raise PromptError("the prompt is empty: give at least one token")
    limit = adapter.shape.max_positions
    if limit and n_prompt + max(max_new_tokens, 0) > limit:
        raise PromptError(f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens exceeds the "
                          f"model's context of {limit} tokens")


@torch.inference_mode()
def prefill(adapter: DecoderAdapter, ids: torch.Tensor, cache, skip=(), skip_mode=None,
            start: int = 0) -> torch.Tensor:
    """Run positions start..start+T-1 through the stack; return the last hidden state (B, 1, D).

    skip_mode for layers in `skip`: None runs them in full, "kv" writes the independent K/V
    projection of the incoming hidden state and passes it through, "drop" does nothing.
    The cache must be empty for those layers' positions (no mask is built: causal SDPA).
    """
    return _stack(adapter, ids, cache, skip, skip_mode, start)[:, -1:, :]  # (B, 1, D)


def _stack(adapter: DecoderAdapter, ids, cache, skip, skip_mode, start) -> torch.Tensor:
    """The layer loop shared by prefill and teacher forcing; returns every position (B, T, D)."""
    skip = frozenset(skip) if skip_mode else frozenset()
    h = adapter.embed(ids)  # (B, T, D)
    pos = adapter.positions(start, ids.shape[1], ids.shape[0])  # (B, T)
    rope = adapter.rotary(h, pos)  # cos, sin: (B, T, Dh)
    for i in range(adapter.n_layers):
        if i not in skip:
            mask = chunk_mask(ids.shape[1], adapter.cache_length(cache, i), h.device)
            h = adapter.run_layer(i, h, pos, rope, cache, mask)  # (B, T, D)
        elif skip_mode == "kv":
            k, v = adapter.project_kv(i, h, rope)  # (B, Hkv, T, Dh) each
            adapter.write_kv(cache, i, k, v)
    return h


def chunk_mask(n_new: int, n_past: int, device) -> torch.Tensor | None:
    """Causal mask for n_new queries after n_past cached keys; None where SDPA's own is right.

    With an empty cache (or one query) SDPA's is_causal is exact. A chunk after a non-empty cache
    needs its diagonal shifted; layers may hold different lengths (pop_no_kv), hence per layer.
    """
    if n_new == 1 or n_past == 0:
        return None
    q = torch.arange(n_new, device=device).unsqueeze(1)  # (T, 1)
    k = torch.arange(n_past + n_new, device=device).unsqueeze(0)  # (1, S+T)
    return (k <= q + n_past)[None, None]  # (1, 1, T, S+T), True = attend


@torch.inference_mode()
def teacher_force(adapter: DecoderAdapter, ids: torch.Tensor, cache, position: int,
                  drop=()) -> torch.Tensor:
    """Feed known tokens at position.. through the stack (minus `drop`) in one chunk.

    Returns float logits for every fed position (B, T, V): logits[:, t] predicts token t+1.
    """
    h = _stack(adapter, ids, cache, drop, "drop" if drop else None, position)  # (B, T, D)
    return adapter.logits(h).float()  # (B, T, V)


@torch.inference_mode()
def decode_step(adapter: DecoderAdapter, ids: torch.Tensor, cache, position: int,
                drop=()) -> torch.Tensor:
    """One token per sequence at `position` through the stack (minus `drop`); logits (B, V)."""
    h = prefill(adapter, ids, cache, skip=drop, skip_mode="drop" if drop else None, start=position)
    return adapter.logits(h)[:, -1, :].float()  # (B, V)


@dataclass
class FirstStep:
    """Where the prompt leaves a run: logits of the first new token, the cache, the next position."""

    logits: torch.Tensor  # (B, V)
    cache: object
    position: int  # position of the first generated token


@torch.inference_mode()
def run_prompt(adapter: DecoderAdapter, ids: torch.Tensor, variant: str = "pop",
               skip=(), counts=None) -> FirstStep:
    """Prompt in -> logits of the first new token out, for one variant (boundary step included).

    `counts` (a counters.CallCounts) is told the stage: "prefill", then "boundary" for x_N.
    """
    check_variant(variant)
    n = ids.shape[1]
    cache = adapter.new_cache()
    mode = _PREFILL_SKIP_MODE[variant]
    _stage(counts, "prefill")
    if variant in ("full", "pop_no_boundary", "static"):
        h = prefill(adapter, ids, cache, skip, mode)  # all N positions
        logits = adapter.logits(h)[:, -1, :].float()  # (B, V)
        return FirstStep(logits, cache, n)
    if n > 1:
        prefill(adapter, ids[:, :-1], cache, skip, mode)  # x_1..x_{N-1}, pruned
    _stage(counts, "boundary")
    logits = decode_step(adapter, ids[:, -1:], cache, n - 1)  # boundary: x_N through the full model
    return FirstStep(logits, cache, n)


def decode_drop(variant: str, skip) -> tuple[int, ...]:
    """Layers removed during decode: only the static variant removes any."""
    return tuple(skip) if variant == "static" else ()


def _stage(counts, name: str) -> None:
    if counts is not None:
        counts.stage = name
