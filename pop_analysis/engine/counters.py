"""Counters of what actually ran, per layer and stage, read from the matmuls themselves.

They let a user see that skipped layers ran no attention or FFN during prefill, only their K/V
projections. Every `torch.nn.functional.linear` call inside the `with` block passes a
TorchFunctionMode that knows which layer's weight it multiplies by: a layer's attention ran when
its output projection did, its FFN when the FFN's output projection (the one back to the hidden
size) did, and its K projection when its K weight (or a fitted K map of a repair) did. No module
hook is involved, so the step-through's recorder (inspection/step_log, forward hooks on the
modules) and these counters are two independent witnesses of the same run.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

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


def ffn_output(adapter: DecoderAdapter, i: int) -> torch.nn.Linear:
    """The FFN's projection back to the hidden size (one per FFN call)."""
    hidden = adapter.shape.hidden
    (out,) = [m for m in adapter.ffn(i).modules()
              if isinstance(m, torch.nn.Linear) and m.out_features == hidden]
    return out


def weight_owners(adapter: DecoderAdapter) -> dict[int, tuple[str, int]]:
    """id(weight) -> (kind, layer) for every weight whose matmul marks a call."""
    owners = {}
    for i in range(adapter.n_layers):
        owners[id(adapter.o_proj(i).weight)] = ("attention", i)
        owners[id(ffn_output(adapter, i).weight)] = ("ffn", i)
        # A K projection is counted whether it uses the layer's weights or fitted ones (pop_repair).
        for m in (adapter.k_proj(i), *adapter.kv_map_modules(i)):
            owners[id(m.weight)] = ("k_proj", i)
    return owners


class _LinearCounter(TorchFunctionMode):
    """Counts F.linear calls on the known weights; everything else passes through untouched."""

    def __init__(self, counts: CallCounts, owners: dict):
        super().__init__()
        self.counts, self.owners = counts, owners

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else (kwargs or {}).get("weight")
            owner = self.owners.get(id(weight))
            if owner is not None:
                self.counts.hit(*owner)
        return func(*args, **(kwargs or {}))


@contextmanager
def count_calls(adapter: DecoderAdapter):
    """Count attention, FFN and k_proj calls of every layer while the block runs."""
    counts = CallCounts(adapter.n_layers)
    with _LinearCounter(counts, weight_owners(adapter)):
        yield counts
