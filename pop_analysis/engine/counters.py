"""Counters of what actually ran, per layer and stage, read from forward hooks.

They let a user see that skipped layers ran no attention or FFN during prefill, only their K/V
projections. Hooks live in a `with` block and are removed in `finally`.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

from pop_analysis.engine.adapter import DecoderAdapter

KINDS = ("attention", "ffn", "k_proj")


class CallCounts:
    """counts[stage][kind][layer] -> calls; `stage` is set by the caller between phases."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self.stage = "prefill"
        self.counts = defaultdict(lambda: {k: [0] * n_layers for k in KINDS})

    def hit(self, kind: str, layer: int) -> None:
        self.counts[self.stage][kind][layer] += 1

    def as_dict(self) -> dict:
        return {stage: {k: list(v) for k, v in kinds.items()} for stage, kinds in self.counts.items()}


@contextmanager
def count_calls(adapter: DecoderAdapter):
    """Count attention, FFN and k_proj calls of every layer while the block runs."""
    counts = CallCounts(adapter.n_layers)
    # A K projection is counted whether it uses the layer's weights or fitted ones (pop_repair).
    modules = {"attention": lambda i: [adapter.attention(i)], "ffn": lambda i: [adapter.ffn(i)],
               "k_proj": lambda i: [adapter.k_proj(i), *adapter.kv_map_modules(i)]}
    handles = []
    try:
        for kind, get in modules.items():
            for i in range(adapter.n_layers):
                hook = (lambda kind, i: lambda *_: counts.hit(kind, i))(kind, i)
                handles.extend(m.register_forward_hook(hook) for m in get(i))
        yield counts
    finally:
        for h in handles:
            h.remove()
