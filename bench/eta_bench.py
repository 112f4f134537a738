"""How well the progress ETA tracks reality: real runs on the embedded model, every Progress
update recorded, the estimate compared with the time that was actually left.

Run it on a quiet machine:

    .venv/bin/python bench/eta_bench.py --threads 2
    ... --parts sweep             # only some parts (sweep, drift, calibration)

For each run it reports, at 10%, 25%, 50% and 75% of the run's wall time, the tracker's estimate
(pop_analysis.progress: measured cost per kind of work, counted down between updates) and the
old one (elapsed / units done * units left), beside the true time left. Nothing is cached.
Prints one JSON object and writes it to a new file under bench/raw/eta_bench/.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from bench_results import save

MARKS = (0.10, 0.25, 0.50, 0.75)


class Recorder:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.updates: list[tuple[float, object]] = []

    def __call__(self, p) -> None:
        self.updates.append((time.perf_counter() - self.t0, p))


def at_marks(rec: Recorder, total_s: float) -> list[dict]:
    """Estimates at fixed fractions of the run, from the last update before each mark."""
    out = []
    for f in MARKS:
        t = f * total_s
        seen = [(ts, p) for ts, p in rec.updates if ts <= t]
        if not seen:
            continue
        ts, p = seen[-1]
        tracker = None if p.eta_s is None else max(p.eta_s - (t - ts), 0.0)
        linear = p.elapsed_s / p.done * (p.total - p.done) - (t - ts) if p.done else None
        out.append({"at": f"{f:.0%}", "true_left_s": round(total_s - t, 1),
                    "tracker_eta_s": None if tracker is None else round(tracker, 1),
                    "not_yet_timed": list(p.unmeasured),
                    "old_linear_eta_s": None if linear is None else round(max(linear, 0.0), 1)})
    return out


def run(name: str, fn) -> dict:
    rec = Recorder()
    t0 = time.perf_counter()
    fn(rec)
    total = time.perf_counter() - t0
    return {"run": name, "seconds": round(total, 1), "updates": len(rec.updates),
            "marks": at_marks(rec, total)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="sweep,drift,calibration")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.engine.models import load_model
    from pop_analysis.experiments import sweep as sw
    from pop_analysis.importance import calibrate as cal
    from pop_analysis.inspection import drift as dr
    from pop_analysis.inspection import drift_length

    lm = load_model("smollm2-135m", device="cpu")
    parts = args.parts.split(",")
    out = {"threads": args.threads, "runs": []}
    if "sweep" in parts:  # the dashboard's default sweep settings
        cfg = sw.SweepConfig(dataset="gsm8k", n_samples=4, max_new_tokens=16, repeats=3)
        out["runs"].append(run("ratio sweep (dashboard defaults: gsm8k, 4 samples, 16 tokens)",
                               lambda p: sw.ratio_sweep(lm, cfg, progress=p)))
    if "drift" in parts:
        out["runs"].append(run("drift vs length 16, 256, 1024, 2048 (8 steps)",
                               lambda p: drift_length.drift_by_length(
                                   lm, [16, 256, 1024, 2048], range(20, 30), dr.DriftConfig(),
                                   progress=p)))
    if "calibration" in parts:
        prompts = load_prompts("builtin", limit=32)
        cfg = cal.CalibrationConfig(n_samples=32, max_new_tokens=32, batch_size=16)
        out["runs"].append(run("calibration, 32 built-in prompts, 32 tokens, batch 16",
                               lambda p: cal.calibrate(lm, prompts, cfg, progress=p)))
    save("eta_bench", args, out)

if __name__ == "__main__":
    main()
