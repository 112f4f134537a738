"""Full against POP under load, through the project's timing protocol.

Per load setting: one small untimed warm-up load on each side, then `rounds` rounds of one load
test per side with the order swapped every round. The per-round ratios full/POP of the median
TTFT, the median TPOT and the output throughput are judged like every other speed figure
(speed.timing: median, IQR, flags). "Busy" counts the CPU of every process but this one, the
engines and the load generator, which are this measurement's own work.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from pop_analysis.speed import timing
from pop_analysis.speed.procs import cpu_seconds
from pop_analysis.progress import Cancelled, Tracker
from pop_analysis.serving.loadgen import LoadGenerator, LoadResult, LoadSpec

WARMUP_PROMPTS = 2


@dataclass
class Target:
    """One side of the comparison: a server URL, and what to call before each of its runs (the
    run-time switch when one engine serves both sides)."""

    name: str  # "full" or the POP variant
    url: str
    before: Callable[[], None] | None = None
    check: Callable[[], None] | None = None  # raises when its engine has died


@dataclass(frozen=True)
class Client:
    """Who sends the load and what to: the load generator, the served model's name and
    tokenizer, and the processes whose CPU is this measurement's own work (engines, generator)."""

    gen: LoadGenerator
    model: str
    tokenizer: str
    own_pids: Callable[[], list[int]] = list

    def run(self, url: str, load: LoadSpec) -> LoadResult:
        return self.gen.run(url, self.model, self.tokenizer, load)


def judge(full: list[float], variant: list[float], first: list[str], other: float | None,
          cfg: timing.TimingConfig) -> timing.Timing:
    """Per-round values (seconds, smaller is better) through the protocol's judgement."""
    cpus = os.cpu_count() or 1  # the engines and the load generator may use every core
    return timing.judge(full, variant, first, cfg, timing.Contention(other, cpus, cpus))


def run_setting(full: Target, pop: Target, client: Client, spec: LoadSpec, tracker: Tracker,
                cfg: timing.TimingConfig) -> dict:
    """One load setting: warm-up, cfg.rounds_floor alternated rounds, the judged row."""
    sides = {"full": full, "variant": pop}
    rounds, own_pids = cfg.rounds_floor, client.own_pids

    def one(side: str, load: LoadSpec) -> LoadResult:
        t = sides[side]
        if t.before:
            t.before()
        try:
            return client.run(t.url, load)
        finally:
            if t.check:
                t.check()

    warm = replace(spec, num_prompts=min(WARMUP_PROMPTS, spec.num_prompts))
    for side in ("full", "variant"):
        tracker.step(1, f"{spec.describe()}: warm-up, {sides[side].name}")
        one(side, warm)
    got: dict[str, list[LoadResult]] = {"full": [], "variant": []}
    first: list[str] = []
    before_other, before_own = timing.other_cpu_seconds(), cpu_seconds(own_pids())
    t0 = os.times().elapsed
    for r in range(rounds):
        order = ("variant", "full") if r % 2 else ("full", "variant")
        first.append(order[0])
        for side in order:
            tracker.step(1, f"{spec.describe()}: round {r + 1} of {rounds}, {sides[side].name}")
            got[side].append(one(side, spec))
    wall = os.times().elapsed - t0
    after_other, after_own = timing.other_cpu_seconds(), cpu_seconds(own_pids())
    other = None
    if before_other is not None and after_other is not None and wall > 0:
        other = max(0.0, (after_other - before_other) - (after_own - before_own)) / wall
    return row(spec, pop.name, got, first, other, cfg)


def row(spec: LoadSpec, variant: str, got: dict, first: list[str], other, cfg) -> dict:
    """The output row: medians over rounds, the judged ratios, every request's times."""
    def per_round(side, fn):
        return [fn(res) for res in got[side]]

    med_ttft = {s: per_round(s, lambda r: r.quantile("ttft_ms", 0.5) / 1e3) for s in got}
    med_tpot = {s: per_round(s, lambda r: r.quantile("tpot_ms", 0.5) / 1e3) for s in got}
    p90_tpot = {s: per_round(s, lambda r: r.quantile("tpot_ms", 0.9) / 1e3) for s in got}
    inv_thr = {s: per_round(s, lambda r: 1.0 / r.output_throughput) for s in got}
    ttft = judge(med_ttft["full"], med_ttft["variant"], first, other, cfg)
    tpot = judge(med_tpot["full"], med_tpot["variant"], first, other, cfg)
    tail = judge(p90_tpot["full"], p90_tpot["variant"], first, other, cfg)
    thr = judge(inv_thr["full"], inv_thr["variant"], first, other, cfg)

    def pooled(side, name, q):
        return round(float(np.quantile(sum((getattr(r, name) for r in got[side]), []), q)), 3)

    out = {"variant": variant, "num_prompts": spec.num_prompts, "input_len": spec.input_len,
           "output_len": spec.output_len,
           "request_rate": None if math.isinf(spec.request_rate) else spec.request_rate,
           "max_concurrency": spec.max_concurrency, "rounds": len(first), "first": first}
    for side, key in (("full", "full"), ("variant", "pop")):
        out[f"ttft_{key}_ms"] = pooled(side, "ttft_ms", 0.5)
        out[f"ttft_p90_{key}_ms"] = pooled(side, "ttft_ms", 0.9)
        out[f"tpot_{key}_ms"] = pooled(side, "tpot_ms", 0.5)
        out[f"tpot_p90_{key}_ms"] = pooled(side, "tpot_ms", 0.9)
        out[f"throughput_{key}"] = round(float(np.median([r.output_throughput for r in got[side]])), 3)
        out[f"failed_{key}"] = sum(r.failed for r in got[side])
        out[f"requests_{key}"] = {"ttft_ms": sum((r.ttft_ms for r in got[side]), []),
                                  "tpot_ms": sum((r.tpot_ms for r in got[side]), [])}
    out.update({"speedup": round(ttft.speedup, 4), **ttft.fields(),
                "tpot_ratio": {"speedup": round(tpot.speedup, 4), **tpot.fields()},
                "tpot_p90_ratio": {"speedup": round(tail.speedup, 4), **tail.fields()},
                "throughput_ratio": {"speedup": round(thr.speedup, 4), **thr.fields()},
                "other_cores": None if other is None else round(other, 2)})
    return out


def serve_bench(full: Target, pop: Target, client: Client, specs: list[LoadSpec],
                rounds: int = 3, progress=None, on_row=None) -> list[dict]:
    """Rows, one per load setting. Cancelled (rows finished so far in .partial) on request."""
    rounds = timing.check_rounds(rounds)
    cfg = timing.TimingConfig(min_rounds=rounds, warmup=0)
    tracker = Tracker(len(specs) * (2 + 2 * max(3, rounds)), progress, "load test")
    rows: list[dict] = []
    try:
        for spec in specs:
            rows.append(run_setting(full, pop, client, spec, tracker, cfg))
            if on_row:
                on_row(rows[-1])
    except Cancelled as c:
        raise c.keep(rows or None)
    return rows
