"""TTFT of precision configurations, and each layer's prompt cost in fp32, int8 and skipped.

Every figure goes through the one timing protocol (timing.measure): a configuration against a
reference (the full model, or POP alone), per-round ratios, median and IQR, flags. The bound a
median is checked against: the FLOP ideal of the skipped layers times INT8_CEILING for the int8
ones (x86 VNNI does four int8 multiply-adds per fp32 lane, and int8 weights are a quarter of the
bytes), so a ratio beyond it is flagged as impossible.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt, run_prompt
from pop_analysis.engine.precision import Configuration, Precision, twins
from pop_analysis.speed.bench import device_clock
from pop_analysis.speed.flops import full_prefill_flops, layer_flops, pop_prefill_flops
from pop_analysis.speed.timing import Machine, Timing, TimingConfig, measure

INT8_CEILING = 4.0  # most an int8 layer can gain over fp32 here (see the module docstring)
FULL = Configuration("full")  # the full model in fp32


def first_token(lm: LoadedModel, ids: torch.Tensor, c: Configuration) -> None:
    """One prompt pass of configuration `c` up to the first token id on the host."""
    run_prompt(lm.adapter, ids, c.setting).logits.argmax(-1).tolist()


def ideal(lm: LoadedModel, n: int, c: Configuration, reference: Configuration = FULL) -> float:
    """Largest possible TTFT ratio reference / c at n tokens (FLOPs, int8 at INT8_CEILING)."""
    return _best_time(lm, n, reference) / _best_time(lm, n, c)


def _best_time(lm: LoadedModel, n: int, c: Configuration) -> float:
    """FLOPs of c's prompt with its int8 layers' share divided by INT8_CEILING."""
    s = lm.adapter.shape
    flops = (pop_prefill_flops(s, n, c.setting) if c.variant != "full"
             else full_prefill_flops(s, n))
    per_layer = layer_flops(s, n, n * (n + 1) // 2)  # one layer, every prompt token
    return flops - len(c.precision.int8) * per_layer * (1 - 1 / INT8_CEILING)


def time_config(lm: LoadedModel, ids: torch.Tensor, c: Configuration,
                reference: Configuration = FULL, cfg: TimingConfig = TimingConfig(),
                lock=None) -> Timing:
    """TTFT of `reference` against `c` on prompt ids (B, N), through the protocol: the speedup
    is reference / c (above 1: c is faster)."""
    check_prompt(lm.adapter, ids.shape[1])
    twins(lm.adapter, c.precision), twins(lm.adapter, reference.precision)  # built before timing
    return measure(lambda: first_token(lm, ids, reference), lambda: first_token(lm, ids, c), cfg,
                   machine=Machine(clock=device_clock(lm.device), lock=lock),
                   ideal=ideal(lm, ids.shape[1], c, reference))


@dataclass
class LayerCost:
    """One layer's prompt time in each precision, milliseconds (medians of protocol rounds)."""

    layer: int
    full_ms: float
    int8_ms: float
    skip_ms: float  # the K/V projection alone
    int8_timing: Timing  # full vs int8, as measured
    skip_timing: Timing  # full vs K/V projection, as measured

    def ms(self, precision: str) -> float:
        return {"full": self.full_ms, "int8": self.int8_ms, "skip": self.skip_ms}[precision]


@torch.inference_mode()
def layer_costs(lm: LoadedModel, n: int, cfg: TimingConfig = TimingConfig(budget_s=0.5),
                seed: int = 0) -> list[LayerCost]:
    """Each layer's time over an n-token prompt (hidden states of the full model on random ids)
    in fp32, int8 and as POP's K/V projection; each layer's cache is fresh every call."""
    a = lm.adapter
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, a.shape.vocab, (1, n), generator=g).to(a.device)  # (1, N)
    h = a.embed(ids)  # (1, N, D)
    pos = a.positions(0, n)  # (1, N)
    rope = a.rotary(h, pos)
    copies = twins(a, Precision(tuple(range(a.n_layers))))
    clock, out = device_clock(lm.device), []
    for i in range(a.n_layers):
        def run(twin=None, i=i, h=h):
            cache = a.new_cache()
            return a.run_layer(i, h, pos, rope, cache, a.layer_mask(i, cache, n), twin)

        def kv(i=i, h=h):
            return a.project_kv(i, h, rope)

        t8 = measure(run, lambda i=i: run(copies[i]), cfg, machine=Machine(clock=clock),
                     ideal=INT8_CEILING)
        ts = measure(run, kv, cfg, machine=Machine(clock=clock))
        out.append(LayerCost(i, float(np.median(t8.full_ms + ts.full_ms)), t8.variant_median_ms,
                             ts.variant_median_ms, t8, ts))
        h = run()  # (1, N, D): the next layer's input
    return out
