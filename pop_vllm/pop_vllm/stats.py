"""The plugin's per-engine counters (pure: no vLLM, no torch): what each step did, read through
`control.pop_stats`."""
from __future__ import annotations


def new_stats() -> dict:
    return {"steps": 0, "pop_steps": 0, "pruned_tokens": 0, "full_tokens_in_pop_steps": 0,
            "decode_only_steps": 0, "decode_only_pop_steps": 0, "recomputed_tokens": 0,
            "split_steps": 0,  # POP steps taken by split.py (the rest ran the eager loop)
            "logprob_full_tokens": 0}  # prompt tokens run full: their request asked prompt log-probs


def count(stats: dict, facts, p) -> None:
    stats["steps"] += 1
    decode_only = bool((facts.computed >= facts.prompt_len).all())
    stats["decode_only_steps"] += decode_only
    stats["recomputed_tokens"] += facts.recomputed()  # > 0 only after a preemption
    stats["logprob_full_tokens"] += p.n_forced
    if p.needs_pop:
        stats["pop_steps"] += 1
        stats["decode_only_pop_steps"] += decode_only
        stats["pruned_tokens"] += p.n_pruned
        stats["full_tokens_in_pop_steps"] += p.n_full
