"""Which tokens of one engine step take POP's pruned path (pure: no vLLM, no torch).

vLLM flattens a step into one token axis: request r contributes `scheduled[r]` tokens at positions
computed[r] .. computed[r] + scheduled[r] - 1, in batch order, possibly followed by padding. POP
prunes a prompt token x_p (skipped layers only project its K/V and pass it through) when p lies
before the request's boundary; every other token (x_N, generated tokens, a recomputed generated
token after preemption) is full. The boundary comes from the request's prompt length, never from
"the last token of the request in this step": a chunk of a long prompt ends before x_N.

A request that asked for prompt log-probs runs its whole prompt on the full path (`full_path`):
its pruned prompt tokens would never pass the skipped layers, so their next-token distributions
would not be the model's (vLLM computes prompt log-probs from every prompt position's logits).

Because a request's positions in a step are contiguous, its full tokens are always a suffix of its
scheduled tokens; `StepPlan.full_counts` relies on that.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .variants import SERVED  # pop_repair: pop's plan, fitted K/V maps


def check_variant(variant: str) -> None:
    if variant not in SERVED:
        raise ValueError(f"unknown POP variant {variant!r}; choose from {', '.join(SERVED)}")


def first_full_position(prompt_len: np.ndarray, variant: str) -> np.ndarray:
    """Per request, the first position that runs the full stack (prompt_len: (R,))."""
    check_variant(variant)
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    if variant == "full":
        return np.zeros_like(prompt_len)
    if variant in ("pop", "pop_repair"):
        return np.maximum(prompt_len - 1, 0)  # x_N (position N-1) is the boundary token
    return prompt_len  # pop_no_boundary: x_N takes the pruned path too


@dataclass(frozen=True)
class StepPlan:
    """Full/pruned split of one step's flattened tokens."""

    n_tokens: int  # length of the token axis (padding included)
    full_index: np.ndarray  # (F,) flattened indices of full tokens, ascending
    pruned_index: np.ndarray  # (P,) flattened indices of pruned tokens, ascending
    full_counts: np.ndarray  # (R,) full tokens per request (a suffix of its scheduled tokens)
    n_padding: int  # tokens after the last request's (neither full nor pruned)
    n_forced: int = 0  # prompt tokens run full because their request asked for prompt log-probs

    @property
    def n_full(self) -> int:
        return int(self.full_index.size)

    @property
    def n_pruned(self) -> int:
        return int(self.pruned_index.size)

    @property
    def needs_pop(self) -> bool:
        """Whether any token takes the pruned path (a decode-only step never does)."""
        return self.n_pruned > 0


def plan_step(prompt_len, computed, scheduled, variant: str = "pop",
              n_tokens: int | None = None, full_path=None) -> StepPlan:
    """Split a step's tokens. prompt_len, computed, scheduled: (R,) per request in batch order;
    full_path: (R,) bool, requests whose every token runs full (prompt log-probs asked)."""
    prompt_len = np.asarray(prompt_len, dtype=np.int64)
    computed = np.asarray(computed, dtype=np.int64)
    scheduled = np.asarray(scheduled, dtype=np.int64)
    if not (prompt_len.shape == computed.shape == scheduled.shape) or prompt_len.ndim != 1:
        raise ValueError("prompt_len, computed and scheduled need one entry per request")
    if (scheduled < 0).any() or (computed < 0).any() or (prompt_len < 1).any():
        raise ValueError("token counts must be >= 0 and prompt lengths >= 1")
    total = int(scheduled.sum())
    n_tokens = total if n_tokens is None else int(n_tokens)
    if n_tokens < total:
        raise ValueError(f"the step holds {n_tokens} tokens but {total} are scheduled")
    first = first_full_position(prompt_len, variant)  # (R,)
    n_pruned = np.clip(first - computed, 0, scheduled)  # (R,) pruned prefix of each request
    n_forced = 0
    if full_path is not None:
        full_path = np.asarray(full_path, dtype=bool)
        if full_path.shape != prompt_len.shape:
            raise ValueError("full_path needs one entry per request")
        n_forced = int(n_pruned[full_path].sum())
        n_pruned = np.where(full_path, 0, n_pruned)  # (R,)
    full_counts = scheduled - n_pruned  # (R,)
    starts = np.concatenate([[0], np.cumsum(scheduled)[:-1]]).astype(np.int64)  # (R,)
    is_full = np.zeros(total, dtype=bool)  # (total,)
    for s, n, p in zip(starts, scheduled, n_pruned):
        is_full[s + p:s + n] = True
    index = np.arange(total, dtype=np.int64)
    return StepPlan(n_tokens=n_tokens, full_index=index[is_full], pruned_index=index[~is_full],
                    full_counts=full_counts, n_padding=n_tokens - total, n_forced=n_forced)
