"""What the weight-value check costs (issue 30): float dtypes from the headers, finite values in
one pass over the loaded tensors.

For each embedded model: load_model with the check against load_model without it, side by side
through the timing protocol (speedup = without / with: below 1 is the check's cost); the check's
own parts timed alone (the finite pass on a freshly loaded model, whose pages the pass touches
first, and again; the header read); and the serving path's check of a folder (headers, then every
tensor through a memory map). Writes a new file under bench/raw/weights_check_bench/.

    .venv/bin/python bench/weights_check_bench.py --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pop_analysis.engine import models
from pop_analysis.engine.weight_values import (checkpoint_files, files_problem, integer_tensor,
    model_tensors, nonfinite_tensor)
from pop_analysis.speed.timing import TimingConfig, measure

from bench_results import save


def timed(fn, repeats: int = 5) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def unchecked(name: str):
    """load_model with both value checks switched off (the code as it was before them)."""
    keep = models.nonfinite_tensor, models.check_dtypes
    models.nonfinite_tensor, models.check_dtypes = (lambda named: None), (lambda *a: True)
    try:
        return models.load_model(name, device="cpu")
    finally:
        models.nonfinite_tensor, models.check_dtypes = keep


def one_model(name: str, budget: float) -> dict:
    folder = models.converted_dir(name)
    models.load_model(name, device="cpu")  # converted and in the page cache before timing
    t = measure(lambda: unchecked(name), lambda: models.load_model(name, device="cpu"),
                TimingConfig(min_rounds=3, max_rounds=15, budget_s=budget))
    fresh = unchecked(name)
    cold = timed(lambda: nonfinite_tensor(model_tensors(fresh.model)), 1)[0]
    warm = timed(lambda: nonfinite_tensor(model_tensors(fresh.model)))
    files = checkpoint_files(folder)
    header = timed(lambda: integer_tensor(files))
    serving = timed(lambda: files_problem(folder, files), 3)
    return {"model": name, "parameters": sum(p.numel() for p in fresh.model.parameters()),
            "file_mib": round(sum(p.stat().st_size for p in files) / 2 ** 20, 1),
            "load_without_ms": round(t.full_median_ms, 1),
            "load_with_ms": round(t.variant_median_ms, 1),
            "without_over_with": round(t.speedup, 4), "iqr": [round(t.low, 4), round(t.high, 4)],
            "rounds": t.rounds, "trustworthy": t.trustworthy, "note": t.note,
            "finite_pass_first_ms": round(cold * 1e3, 1),
            "finite_pass_again_ms": round(statistics.median(warm) * 1e3, 1),
            "header_dtypes_ms": round(statistics.median(header) * 1e3, 2),
            "serving_folder_check_ms": round(statistics.median(serving) * 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed rounds per model")
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [one_model(m.strip(), args.budget) for m in args.models.split(",") if m.strip()]
    result = {"threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    save("weights_check_bench", args, result)


if __name__ == "__main__":
    main()
