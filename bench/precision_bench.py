"""Stage-aware precision (docs/precision.md): int8 prompt layers, fp32 decode, with POP.

Stages, each writing a new bench/raw/precision_bench/<stage>_<model>__<every parameter>__<UTC
start>.json (kernels: kernels__...; the report reads each one's newest):

    python bench/precision_bench.py kernels                      # int8 kernels vs fp32, per shape
    python bench/precision_bench.py ttft --model smollm2-135m    # TTFT at 32/128/512/2048
    python bench/precision_bench.py quality --model smollm2-135m --samples 100
    python bench/precision_bench.py planq --model smollm2-135m   # planner inputs, grid KL
    python bench/precision_bench.py plan --model smollm2-135m    # timing: planner vs the grid
    python bench/precision_bench.py report                       # markdown tables + frontier

Timing stages print speed figures: run them on an otherwise quiet machine (a flagged figure is
reported flagged). The configurations: POP alone (last third skipped), int8 prefill alone (every
layer's prompt in int8, x_N and decode fp32), uniform int8 (prompt, x_N and decode in int8), and
POP + int8 prefill (the kept layers' prompt in int8).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # busy-waiting threads: docs/timing.md
ROOT = Path(__file__).resolve().parent.parent
_RUN: dict = {}  # what -> this run's raw output file

import torch

from pop_analysis.engine.int8 import memory
from pop_analysis.engine.models import load_model
from pop_analysis.engine.pop import run_prompt
from pop_analysis.experiments.precision_frontier import (Point, check_pick, frontier, grid,
                                                         standard)
from pop_analysis.importance.calibrate import CalibrationConfig, cached_calibration
from pop_analysis.engine.precision import from_plan
from pop_analysis.importance.precision_plan import int8_errors, layer_losses, plan, predicted_loss
from pop_analysis.data.prompts import load_prompts
from pop_analysis.inspection.cache_drift import cache_cosine
from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.summary import metric_fields
from pop_analysis.quality import stats
from pop_analysis.speed.bench import random_prompt
from pop_analysis.speed.precision_speed import FULL, layer_costs, time_config
from pop_analysis.speed.timing import TimingConfig
from pop_vllm.run_setting import RunSetting

from bench_results import RAW, RawFile, latest

OUT = RAW / "precision_bench"

LENGTHS = (32, 128, 512, 2048)


def write(name: str, payload: dict, args) -> None:
    from pop_analysis.speed.machine import cpu_model, int8_isa

    payload = {**payload, "threads": torch.get_num_threads(), "load": os.getloadavg(),
               "cpu": cpu_model(), "int8_isa": int8_isa()}
    if name not in _RUN:
        _RUN[name] = RawFile("precision_bench", args, what=name)
    print(f"wrote {_RUN[name].write(payload)}", file=sys.stderr)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timing_row(t) -> dict:
    return {"speedup": t.speedup, "iqr": [t.low, t.high], "rounds": t.rounds,
            "full_ms": t.full_median_ms, "variant_ms": t.variant_median_ms,
            "trustworthy": t.trustworthy, "note": t.note, "ideal": t.ideal}


def stage_ttft(lm, args) -> None:
    configs, rows = standard(lm.adapter.n_layers), []
    pop = configs[0]
    cfg = TimingConfig(budget_s=args.budget)
    for n in args.lengths:
        ids = random_prompt(lm, n)
        for c in configs:
            t = time_config(lm, ids, c, FULL, cfg)
            rows.append({"tokens": n, "config": c.name, "against": "full", **timing_row(t)})
            log(f"{n} {c.name} vs full: {t.speedup:.2f}x {t.note or ''}")
        t = time_config(lm, ids, configs[3], pop, cfg)
        rows.append({"tokens": n, "config": configs[3].name, "against": "pop", **timing_row(t)})
        log(f"{n} pop+int8 vs pop: {t.speedup:.2f}x {t.note or ''}")
        write(f"ttft_{lm.name}", {"rows": rows, "memory": memory(lm.adapter)}, args)


def drift_rows(lm, items, configs) -> dict:
    """Per config, per item: mean over layers of the prompt cache's K and V cosine to full's."""
    a, out = lm.adapter, {c.name: {"k": [], "v": [], "k_min": [], "v_min": []} for c in configs}
    for it in items:
        ids = torch.tensor([list(it.prompt_ids)])  # (1, N)
        ref = run_prompt(a, ids, RunSetting.full()).cache
        for c in configs:
            cos = cache_cosine(a, run_prompt(a, ids, c.setting).cache,
                               ref)
            for q in ("k", "v"):
                out[c.name][q].append(sum(cos[q]) / len(cos[q]))
                out[c.name][f"{q}_min"].append(min(cos[q]))
    return out


def stage_quality(lm, args) -> None:
    configs = standard(lm.adapter.n_layers)
    items = load_eval_set(lm, "gsm8k", args.start + args.samples).items[args.start:]
    variants = [Arm(c.name, c.setting) for c in configs]
    t0 = time.perf_counter()
    done = [0]

    def step(k):
        done[0] += k
        log(f"quality {done[0]}/{len(items) * (len(variants) + 1)} item-runs (the full model too)")
    scores = evaluate_variants(lm, items, variants, args.max_new_tokens, generate=True, step=step)
    log("drift")
    drift = drift_rows(lm, items, configs)
    summary = {name: metric_fields(s, scores["full"] if name != "full" else None)
               for name, s in scores.items()}
    for name, d in drift.items():
        for q, vals in d.items():
            e = stats.mean_ci(vals, bounds=(-1.0, 1.0))
            summary[name][f"cache_{q}_cos"], summary[name][f"cache_{q}_cos_ci"] = e.value, list(e.ci)
    per_item = {n: {"continuation_nll": s.continuation_nll, "next_token_kl": s.next_token_kl,
                    "greedy_agreement": s.greedy_agreement} for n, s in scores.items()}
    part = f"_s{args.start}" if args.start else ""  # a slice of the items (report merges them)
    write(f"quality_{lm.name}{part}", {"n": len(items), "start": args.start,
                                 "data": "gsm8k test (gold answers)",
                                 "max_new_tokens": args.max_new_tokens,
                                 "seconds": time.perf_counter() - t0, "summary": summary,
                                 "per_item": per_item, "drift": drift}, args)


def stage_plan_quality(lm, args) -> None:
    """The planner's inputs that need no clock (gate sensitivities, int8 errors) and the grid's
    quality: continuation KL of every grid configuration (no timing lock needed)."""
    a = lm.adapter
    prompts = load_prompts("builtin", limit=args.calibration)
    cal = cached_calibration(lm, prompts, CalibrationConfig(n_samples=args.calibration))[0]
    log("calibrated")
    err = int8_errors(lm, [list(p) for p in _encode(lm, prompts.prompts[:8])])
    configs = grid(a.n_layers)
    items = load_eval_set(lm, "gsm8k", args.grid_samples).items
    scores = evaluate_variants(lm, items, [Arm(c.name, c.setting)
                                           for c in configs], args.max_new_tokens, generate=False)
    write(f"planq_{lm.name}", {"calibration": {"n": cal.n_samples, "prefill": cal.prefill},
                               "int8_error": err, "grid_n": len(items),
                               "kl": {c.name: scores[c.name].next_token_kl for c in configs}},
          args)


def stage_plan(lm, args) -> None:
    """Under the timing lock: per-layer costs, the planner's pick under POP alone's predicted
    loss, TTFT of the pick and of every grid configuration; the pick's KL; the check."""
    a = lm.adapter
    q = json.loads(latest(OUT, f"planq_{lm.name}__*.json")[-1].read_text())
    losses = layer_losses(q["calibration"]["prefill"], q["int8_error"])
    lc = layer_costs(lm, args.plan_tokens)
    costs = [{p: c.ms(p) for p in ("full", "int8", "skip")} for c in lc]
    log("layer costs measured")
    budget = predicted_loss(standard(a.n_layers)[0].plan(a.n_layers), losses)  # POP alone's
    pick = plan(costs, losses, budget)
    picked = from_plan("planner", list(pick.layers))
    items = load_eval_set(lm, "gsm8k", q["grid_n"]).items
    kl = dict(q["kl"])
    kl["planner"] = evaluate_variants(lm, items, [Arm("planner", picked.setting)],
                                      args.max_new_tokens, generate=False)["planner"].next_token_kl
    ids = random_prompt(lm, args.plan_tokens)
    points, rows = [], []
    for c in [picked] + grid(a.n_layers):
        t = time_config(lm, ids, c, FULL, TimingConfig(budget_s=args.budget))
        est = stats.mean_ci(kl[c.name], bounds=(0, float("inf")))
        plan_ = c.plan(a.n_layers)
        rows.append({"name": c.name, "plan": "".join(p[0].upper() for p in plan_),
                     "predicted_loss": predicted_loss(plan_, losses),
                     "predicted_ms": sum(costs[i][p] for i, p in enumerate(plan_)),
                     "kl": est.value, "kl_ci": list(est.ci), **timing_row(t)})
        points.append(Point(c.name, t.speedup, est.value, t.trustworthy))
        log(f"{c.name}: {t.speedup:.2f}x kl {est.value:.4f} {t.note or ''}")
    write(f"plan_{lm.name}", {
        "layer_costs": [{"layer": c.layer, "full_ms": c.full_ms, "int8_ms": c.int8_ms,
                         "skip_ms": c.skip_ms, "int8_flag": c.int8_timing.note,
                         "skip_flag": c.skip_timing.note} for c in lc],
        "budget": budget, "pick": asdict(pick), "rows": rows, "grid_n": q["grid_n"],
        "frontier": [p.name for p in frontier(points)],
        "check": check_pick(points[0], points[1:])}, args)


def _encode(lm, texts):
    from pop_analysis.engine.generate import encode

    return [encode(lm, t) for t in texts]


def stage_kernels(args) -> None:
    from kernel_probe import probe  # bench/kernel_probe.py

    write("kernels", probe(args.lengths), args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("kernels", "ttft", "quality", "planq", "plan", "report"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--samples", type=int, default=100, help="quality items (GSM8K test)")
    p.add_argument("--start", type=int, default=0, help="first quality item (runs in slices)")
    p.add_argument("--grid-samples", type=int, default=32, help="items per grid configuration")
    p.add_argument("--calibration", type=int, default=16, help="calibration prompts (builtin)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=LENGTHS)
    p.add_argument("--plan-tokens", type=int, default=512)
    p.add_argument("--budget", type=float, default=2.0, help="timing budget per comparison, s")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.stage == "report":
        from precision_report import report

        print(report(OUT))
        return
    if args.stage == "kernels":
        stage_kernels(args)
        return
    lm = load_model(args.model, device="cpu")
    {"ttft": stage_ttft, "quality": stage_quality, "planq": stage_plan_quality,
     "plan": stage_plan}[args.stage](lm, args)


if __name__ == "__main__":
    main()
