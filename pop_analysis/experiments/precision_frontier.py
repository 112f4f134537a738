"""Configurations of prompt precision, their frontier of TTFT against quality, and the check of the
planner's pick against an exhaustive search over a grid.

A point is one configuration measured both ways: its TTFT speedup over the full model (timing
protocol) and a quality loss (e.g. continuation KL to the full model, lower is better).
"""
from __future__ import annotations

from dataclasses import dataclass

from pop_analysis.engine.precision import Configuration, Precision, from_plan
from pop_analysis.engine.skipset import last_block
from pop_vllm.run_setting import RunSetting

INT8_SHARES = {"none": 0.0, "upper half": 0.5, "all but 2": None, "all": 1.0}  # of the kept layers
SKIP_SHARES = (0.0, 1 / 6, 1 / 4, 1 / 3)  # tail blocks (the paper's is a third)


def standard(n_layers: int, ratio: float = 1 / 3) -> list[Configuration]:
    """The issue's four: POP alone, int8 prefill alone, uniform int8, POP + int8 prefill."""
    skip = last_block(n_layers, ratio)
    every, kept = tuple(range(n_layers)), tuple(i for i in range(n_layers) if i not in skip)
    full = RunSetting.full()
    return [Configuration("pop", RunSetting(skip)),
            Configuration("int8 prefill", full.replace(precision=Precision(every))),
            Configuration("uniform int8", full.replace(precision=Precision(every, True))),
            Configuration("pop + int8 prefill", RunSetting(skip, precision=Precision(kept)))]


def grid(n_layers: int) -> list[Configuration]:
    """len(SKIP_SHARES) x len(INT8_SHARES) configurations: a tail block skipped, and none, the
    upper half, all but the first two, or all of the kept layers in int8."""
    out = []
    for ratio in SKIP_SHARES:
        skip = last_block(n_layers, ratio)
        kept = [i for i in range(n_layers) if i not in skip]
        for name, share in INT8_SHARES.items():
            int8 = kept[2:] if share is None else kept[len(kept) - round(share * len(kept)):]
            plan = ["skip" if i in skip else "int8" if i in int8 else "full"
                    for i in range(n_layers)]
            out.append(from_plan(f"skip {len(skip)}, int8 {name}", plan))
    return out


@dataclass(frozen=True)
class Point:
    """One configuration measured: TTFT speedup over the full model and a quality loss."""

    name: str
    speedup: float  # full / configuration TTFT, median of the protocol's rounds
    loss: float  # lower is better (KL to the full model, or 1 - agreement)
    trustworthy: bool = True  # the timing's flag


def frontier(points) -> list[Point]:
    """The points no other point beats on both axes (faster and no worse, or better and no
    slower), by rising loss."""
    out = [p for p in points
           if not any((q.speedup >= p.speedup and q.loss < p.loss) or
                      (q.speedup > p.speedup and q.loss <= p.loss) for q in points)]
    return sorted(out, key=lambda p: (p.loss, -p.speedup))


def best_at(points, loss: float) -> Point | None:
    """The fastest point whose loss is at most `loss` (None: none is that good)."""
    ok = [p for p in points if p.loss <= loss]
    return max(ok, key=lambda p: p.speedup) if ok else None


def check_pick(pick: Point, points) -> dict:
    """The planner's measured pick against the exhaustive search's best at equal or better
    quality: their speedups and the pick's share of the best."""
    best = best_at(points, pick.loss)
    return {"pick": pick.name, "pick_speedup": pick.speedup, "pick_loss": pick.loss,
            "best": best.name if best else None,
            "best_speedup": best.speedup if best else None,
            "best_loss": best.loss if best else None,
            "share_of_best": pick.speedup / best.speedup if best else None,
            "searched": len(points)}


FULL_CONFIG = Configuration("full")


def measure_points(lm, configs, items, ids, timing=None, on_config=None) -> list[Point]:
    """Each configuration's TTFT speedup over the full model on prompt ids (1, N) (timing
    protocol) and its continuation KL to the full model over `items` (teacher-forced, batched);
    on_config(k, total) after each."""
    from pop_analysis.quality.evaluate import Arm, evaluate_variants
    from pop_analysis.speed.precision_speed import FULL, time_config
    from pop_analysis.speed.timing import TimingConfig

    variants = [Arm(c.name, c.setting) for c in configs]
    scores = evaluate_variants(lm, items, variants, max_new_tokens=16, generate=False)
    out = []
    for k, c in enumerate(configs):
        t = time_config(lm, ids, c, FULL, timing or TimingConfig(budget_s=0.5))
        kl = scores[c.name].next_token_kl
        out.append(Point(c.name, t.speedup, sum(kl) / len(kl), t.trustworthy))
        if on_config:
            on_config(k + 1, len(configs))
    return out
