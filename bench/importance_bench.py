"""The importance methods' two performance targets, the figures in docs/benchmarks.md.

    python bench/importance_bench.py forward --prompts 32
    python bench/importance_bench.py dropone --prompts 32 --compare-prompts 8

forward: every forward-only metric (Block Influence, angular distance, sub-layer cosine, relative
  magnitude: hooks_pass.forward_metrics, one pass) against the gate calibration (calibrate_ids:
  sampling, gated forwards and the backward) on the same prompts, side by side through the timing
  protocol (speed/timing.py: one warm-up of both, then rounds with the order swapped). The
  protocol's "speedup" is calibration time / forward-only time: the target is >= 2 (the
  forward-only metrics in at most half the calibration's wall time).
dropone: prefill-only drop-one (methods_run.drop_one: one POP variant per layer, each from its own
  layer up over the full model's shared trunk) over --prompts prompts, timed once after a
  one-prompt warm-up, beside one batched evaluation of the full model alone on the same prompts
  (its greedy continuation and teacher-forced pass: drop-one's fixed part). On
  --compare-prompts prompts the same drop-one is timed against itself with the trunk sharing
  switched off (every variant from layer 0), side by side through the timing protocol.
Each prints one JSON object with the conditions: threads, load average, other processes' CPU use.
"""
from __future__ import annotations

import argparse
import os
import time
from unittest import mock

import torch

from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.generate import encode
from pop_analysis.engine.models import load_model
from pop_analysis.experiments.methods_run import drop_one
from pop_analysis.importance.calibrate import CalibrationConfig, calibrate_ids
from pop_analysis.importance.hooks_pass import forward_metrics
from pop_analysis.quality import evaluate
from pop_analysis.quality.evalsets import NAMED, data_dir
from pop_analysis.quality.items import EvalItem
from pop_analysis.speed.timing import TimingConfig, measure, other_cpu_seconds_but_ours


def prompt_ids(lm, dataset: str, n: int) -> list[list[int]]:
    source = str(data_dir() / NAMED[dataset]) if dataset in NAMED else dataset
    return [encode(lm, text) for text in load_prompts(source, limit=n).prompts]


def conditions(cpu0, t0) -> dict:
    cpu1 = other_cpu_seconds_but_ours()
    other = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / (time.perf_counter() - t0)
    return {"threads": torch.get_num_threads(), "load_avg_1min": round(os.getloadavg()[0], 2),
            "other_cores": None if other is None else round(other, 2),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "torch": torch.__version__}


def timing_fields(t) -> dict:
    return {"ratio_median": round(t.speedup, 3), "ratio_iqr": [round(t.low, 3), round(t.high, 3)],
            "slow_s": [round(x / 1e3, 2) for x in t.full_ms],
            "fast_s": [round(x / 1e3, 2) for x in t.variant_ms], "rounds": t.rounds,
            "trustworthy": t.trustworthy, "note": t.note}


def forward(lm, args) -> dict:
    ids = prompt_ids(lm, args.dataset, args.prompts)
    cal = CalibrationConfig(n_samples=len(ids), max_new_tokens=args.new_tokens, seed=args.seed)
    cpu0, t0 = other_cpu_seconds_but_ours(), time.perf_counter()
    t = measure(lambda: calibrate_ids(lm, ids, cal), lambda: forward_metrics(lm, ids),
                TimingConfig(min_rounds=args.rounds, budget_s=1.0, max_rounds=args.rounds))
    return {"what": "gate calibration / forward-only metrics", "prompts": len(ids),
            "prompt_tokens_mean": round(sum(map(len, ids)) / len(ids), 1),
            "calibration_new_tokens": args.new_tokens, **timing_fields(t),
            "target": "ratio >= 2 (forward-only in at most half the calibration's time)",
            "met": t.speedup >= 2.0, **conditions(cpu0, t0)}


def full_only(lm, ids, new_tokens: int) -> None:
    evaluate.evaluate_variants(lm, [EvalItem(tuple(p)) for p in ids], [], new_tokens,
                               generate=False)


def dropone(lm, args) -> dict:
    ids = prompt_ids(lm, args.dataset, args.prompts)
    drop_one(lm, ids[:1], args.new_tokens)  # warm-up
    cpu0, t0 = other_cpu_seconds_but_ours(), time.perf_counter()
    t1 = time.perf_counter()
    drop_one(lm, ids, args.new_tokens)
    drop_s = time.perf_counter() - t1
    t1 = time.perf_counter()
    full_only(lm, ids, args.new_tokens)
    full_s = time.perf_counter() - t1
    out = {"prompts": len(ids), "layers": lm.adapter.n_layers, "new_tokens": args.new_tokens,
           "prompt_tokens_mean": round(sum(map(len, ids)) / len(ids), 1),
           "dropone_s": round(drop_s, 1), "full_model_evaluation_s": round(full_s, 1),
           "dropone_in_full_evaluations": round(drop_s / full_s, 1), **conditions(cpu0, t0)}
    small = ids[:args.compare_prompts]
    with_trunk = lambda: drop_one(lm, small, args.new_tokens)  # noqa: E731

    def without_trunk():
        with mock.patch.object(evaluate, "start_layer", lambda adapter, engine, skip: 0):
            drop_one(lm, small, args.new_tokens)

    cpu0, t0 = other_cpu_seconds_but_ours(), time.perf_counter()
    t = measure(without_trunk, with_trunk, TimingConfig(min_rounds=3, max_rounds=3, budget_s=1.0))
    out["trunk_sharing"] = {"what": "drop-one without / with the shared trunk",
                            "prompts": len(small), **timing_fields(t), **conditions(cpu0, t0)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("forward", "dropone"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dataset", default="wizardlm")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--compare-prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    row = forward(lm, args) if args.mode == "forward" else dropone(lm, args)
    from bench_results import save

    save("importance_bench", args, {"model": args.model, "mode": args.mode, **row}, what=args.mode)


if __name__ == "__main__":
    main()
