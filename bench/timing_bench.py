"""The timing protocol measured on the embedded model: noise, flags, the page's cost, ideals.

Run it on an otherwise quiet machine (it starts and stops its own CPU hog, by pid):

    .venv/bin/python bench/timing_bench.py --threads 2
    ... --parts noise,empty            # only some parts

Parts:
  noise   relative spread of the per-round ratios and other processes' CPU use, quiet and with a
          hog keeping one core busy (the data behind the spread and busy thresholds)
  empty   empty skip set: medians quiet (target 0.95-1.05) and with the hog (0.90-1.10 or flagged)
  hog     with the hog: the sweep path and the Generate page's path, counting results above
          1.10x the ideal that were not flagged (target: none)
  page    the Generate page's extra timing cost at 512 tokens (after a stream-like warm-up)
  shares  speedup, range, FLOP and roofline ideals and their shares at 32/128/512/2048 tokens
Prints one JSON object; writes it after every part to a new file under bench/raw/timing_bench/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager


import torch

from pop_analysis.engine.models import load_model
from pop_analysis.experiments.sweep_speed import measure_speedup
from pop_analysis.speed.bench import (
    bench_length,
    first_token,
    random_prompt,
    time_prefill,
)
from pop_analysis.speed.machine import machine_rates
from pop_analysis.speed.timing import TimingConfig, other_cpu_seconds
from pop_vllm.run_setting import RunSetting

from bench_results import RawFile

PAPER_SKIP = tuple(range(20, 30))
FULL = RunSetting.full()
QUIET_WAIT = 120.0  # seconds a quiet part waits for other processes to calm down (set by --quiet-wait)
SWEEP_TIMING = TimingConfig()  # a sweep row's defaults: >= 3 rounds, 2 s budget, 1 warm-up
RAW = TimingConfig(spread_limit=1e9, busy_cores=1e9)  # flags off: the raw spread and load


@contextmanager
def hog():
    """A child process spinning one core until the block ends; stopped by its pid."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)
    try:
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def summary(values) -> dict:
    v = sorted(values)
    return {"n": len(v), "median": round(statistics.median(v), 4), "max": round(v[-1], 4),
            "min": round(v[0], 4), "values": [round(x, 4) for x in v]}


def one(lm, length, skip, cfg, lock=None) -> dict:
    ids = random_prompt(lm, length)  # (1, N)
    p = time_prefill(lm, ids, RunSetting(skip), cfg, lock=lock)
    t = p.timing
    return {"length": length, "skip": len(skip), "speedup": round(t.speedup, 4),
            "range": [round(t.low, 4), round(t.high, 4)], "rounds": t.rounds,
            "spread": round(t.spread, 4), "other_cores": round(t.other_cores or 0, 3),
            "ideal": round(p.ideal_speedup, 4), "roofline": round(p.roofline_speedup, 4),
            "trustworthy": t.trustworthy, "note": t.note,
            "ratios": [round(x, 4) for x in t.ratios]}


def part_noise(lm, reps: int) -> dict:
    out = {}
    cases = [(32, PAPER_SKIP), (128, PAPER_SKIP), (512, PAPER_SKIP), (128, ())]
    for cond in ("quiet", "hog"):
        runs = []
        if cond == "quiet":
            out["other_cores_before_quiet"] = wait_quiet(QUIET_WAIT)
        ctx = hog() if cond == "hog" else _nothing()
        with ctx:
            for _ in range(reps):
                for n, skip in cases:
                    runs.append(one(lm, n, skip, RAW))
        out[cond] = {"runs": runs, "spread": summary(r["spread"] for r in runs),
                     "other_cores": summary(r["other_cores"] for r in runs)}
    return out


@contextmanager
def _nothing():
    yield None


def wait_quiet(max_s: float, window: float = 2.0, limit: float = 0.1) -> float | None:
    """Wait (up to max_s) for a window in which other processes use under `limit` cores;
    returns the last window's use (None off Linux). Quiet parts record it."""
    end = time.time() + max_s
    while True:
        a, t = other_cpu_seconds(), time.perf_counter()
        time.sleep(window)
        b = other_cpu_seconds()
        if a is None or b is None:
            return None
        used = (b - a) / (time.perf_counter() - t)
        if used < limit or time.time() > end:
            return round(used, 3)


def part_empty(lm, reps: int) -> dict:
    out = {}
    for cond in ("quiet", "hog"):
        before = wait_quiet(QUIET_WAIT) if cond == "quiet" else None
        with (hog() if cond == "hog" else _nothing()):
            runs = [one(lm, n, (), SWEEP_TIMING) for _ in range(reps) for n in (32, 128, 512)]
        ok = [(0.95 if cond == "quiet" else 0.90) <= r["speedup"] <= (1.05 if cond == "quiet"
                                                                        else 1.10)
              or (cond == "hog" and not r["trustworthy"]) for r in runs]
        out[cond] = {"runs": runs, "medians": summary(r["speedup"] for r in runs),
                     "other_cores_before": before,
                     "flagged": sum(not r["trustworthy"] for r in runs), "meets_target": all(ok)}
    return out


def part_hog(lm, reps: int) -> dict:
    from dashboard.panels.generate_speed import PAGE_TIMING
    from dashboard.session.resources import RunLock

    lock = RunLock()
    rows = []
    with hog():
        for _ in range(reps):
            for n in (32, 128, 512):
                for skip in (PAPER_SKIP, tuple(range(15, 30)), ()):
                    p = measure_speedup(lm, RunSetting(skip), n, SWEEP_TIMING)
                    rows.append({"path": "sweep", **_flat(p)})
                    ids = random_prompt(lm, n)
                    first_token(lm, ids, FULL), first_token(lm, ids, RunSetting(skip))  # stream
                    p = time_prefill(lm, ids, RunSetting(skip), PAGE_TIMING, lock=lock.hold)
                    rows.append({"path": "generate page", **_flat(p)})
    bad = [r for r in rows if r["trustworthy"] and r["speedup"] > 1.10 * max(r["ideal"],
                                                                              r["roofline"])]
    above_flop = [r for r in rows if r["trustworthy"] and r["speedup"] > 1.10 * r["ideal"]]
    return {"rows": rows, "flagged": sum(not r["trustworthy"] for r in rows), "total": len(rows),
            "unflagged_above_1.1x_ideal": len(bad), "unflagged_above_1.1x_flop_ideal": len(above_flop)}


def _flat(p) -> dict:
    t = p.timing
    return {"length": p.tokens, "speedup": round(t.speedup, 4),
            "full_ms": round(t.full_median_ms, 1), "pop_ms": round(t.variant_median_ms, 1),
            "range": [round(t.low, 4), round(t.high, 4)], "rounds": t.rounds,
            "ideal": round(p.ideal_speedup, 4), "roofline": round(p.roofline_speedup, 4),
            "other_cores": round(t.other_cores or 0, 3), "trustworthy": t.trustworthy,
            "note": t.note}


def part_page(lm, reps: int) -> dict:
    from dashboard.panels.generate_speed import PAGE_TIMING
    from dashboard.session.resources import RunLock

    lock, out = RunLock(), []
    quiet = wait_quiet(QUIET_WAIT)
    ids = random_prompt(lm, 512)  # (1, 512)
    for _ in range(reps):
        first_token(lm, ids, FULL), first_token(lm, ids, RunSetting(PAPER_SKIP))  # the stream
        t0 = time.perf_counter()
        p = time_prefill(lm, ids, RunSetting(PAPER_SKIP), PAGE_TIMING, lock=lock.hold)
        out.append({"seconds": round(time.perf_counter() - t0, 3), **_flat(p)})
    return {"runs": out, "seconds": summary(r["seconds"] for r in out), "other_cores_before": quiet,
            "round_s": round(statistics.median((r["full_ms"] + r["pop_ms"]) / 1e3 for r in out), 3)}


def part_shares(lm, budget: float) -> dict:
    rows = []
    for n in (32, 128, 512, 2048):
        quiet = wait_quiet(QUIET_WAIT)
        rows.append({**bench_length(lm, n, PAPER_SKIP, TimingConfig(min_rounds=3, budget_s=budget)).as_dict(),
                     "other_cores_before": quiet})
    return {"rows": rows}


PARTS = {"noise": part_noise, "empty": part_empty, "hog": part_hog, "page": part_page}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="noise,empty,hog,page,shares")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case")
    ap.add_argument("--budget", type=float, default=10.0, help="timing budget per length (shares)")
    ap.add_argument("--quiet-wait", type=float, default=120.0,
                    help="seconds a quiet part may wait for other processes to go idle")
    args = ap.parse_args()
    global QUIET_WAIT
    QUIET_WAIT = args.quiet_wait
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu")
    s = lm.adapter.shape
    rates = machine_rates("cpu", lm.dtype, args.threads, (s.hidden, s.intermediate), refresh=True)
    report = {"threads": args.threads, "cpus": os.cpu_count(), "load_at_start": os.getloadavg(),
              "rates": {"rows": rates.rows, "gflops": [round(x / 1e9, 1) for x in rates.flops_per_s],
                        "bandwidth_gb_s": round(rates.bytes_per_s / 1e9, 2)}}
    t0 = time.time()
    out = RawFile("timing_bench", args)
    for part in args.parts.split(","):
        t = time.time()
        report[part] = part_shares(lm, args.budget) if part == "shares" else PARTS[part](lm, args.reps)
        report[part]["wall_s"] = round(time.time() - t, 1)
        print(f"{part}: {report[part]['wall_s']} s", file=sys.stderr, flush=True)
        report["wall_s"] = round(time.time() - t0, 1)
        report["load_at_end"] = os.getloadavg()
        out.write(report)  # after each part: a timeout keeps the rest
    print(json.dumps(report))
    print(f"raw output: {out.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
