"""POP's variants: one enum for POP Lab (library, CLI, dashboard) and the plugin (pure: no vLLM).

A StrEnum, so a variant is also its own name: `Variant.POP == "pop"`, JSON and cache keys hold
the plain string, and a string read from a link or a stored record compares equal.
"""
from __future__ import annotations

from enum import StrEnum


class Variant(StrEnum):
    FULL = "full"  # the unmodified model
    POP = "pop"  # skipped layers only project K/V for x_1..x_(N-1); x_N and decode run in full
    POP_NO_KV = "pop_no_kv"  # ablation: skipped layers write no prompt K/V
    POP_NO_BOUNDARY = "pop_no_boundary"  # ablation: x_N takes the pruned path too
    STATIC = "static"  # the layers removed in prefill and decode (ShortGPT-style)
    POP_REPAIR = "pop_repair"  # pop, the skipped layers' K/V from fitted maps (beyond the paper)


VARIANTS = tuple(Variant)  # every variant: the one meaning of this name

# What the vLLM plugin serves (pop_no_kv: run_setting.NO_KV_REASON; static is not POP).
SERVED = (Variant.FULL, Variant.POP, Variant.POP_NO_BOUNDARY, Variant.POP_REPAIR)


class SkipMode(StrEnum):
    """What a layer of the skip set does for a pruned prompt token."""

    KV = "kv"  # project K/V from the hidden state that reaches it, write them, pass h through
    REPAIR = "repair"  # as KV, with the fitted K/V maps of the skip set
    DROP = "drop"  # nothing: no K/V, h passes through (pop_no_kv's prompt, static everywhere)


# Per variant, how its skipped layers treat prompt positions (None: they run in full).
PREFILL_SKIP_MODE = {Variant.FULL: None, Variant.POP: SkipMode.KV, Variant.POP_NO_KV: SkipMode.DROP,
                     Variant.POP_NO_BOUNDARY: SkipMode.KV, Variant.STATIC: SkipMode.DROP,
                     Variant.POP_REPAIR: SkipMode.REPAIR}
# Variants whose x_N goes through the same stack as the rest of the prompt (no boundary step).
NO_BOUNDARY = (Variant.FULL, Variant.POP_NO_BOUNDARY, Variant.STATIC)
