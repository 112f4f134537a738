"""Time the check of a stored record (records.check) and a whole load (read + parse + check).

Records have the largest sizes the dashboard and CLI write for the embedded model: a calibration
of 30 layers x 16 samples with leave-one-out, a drift result of 30 layers x 256 heatmap columns
x 8 decode steps with quantiles, an ablation sweep of 7 rows. Values are random; the check's
cost depends on sizes only. Prints one JSON line: median and 90th percentile in ms, per kind.

    .venv/bin/python bench/record_check_bench.py
"""
from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time

L, N, T, K = 30, 16, 256, 8  # layers, samples, heatmap columns, decode steps


def vec(n: int) -> list[float]:
    return [random.random() for _ in range(n)]


def calibration() -> dict:
    stages = lambda: {"prefill": vec(L), "decode": vec(L)}  # noqa: E731
    shape = {"n_layers": L, "hidden": 576, "n_heads": 9, "n_kv_heads": 3, "head_dim": 64,
             "intermediate": 1536, "vocab": 49152, "max_positions": 8192}
    return {"model": "smollm2-135m", "dataset": "builtin", "n_samples": N, "n_layers": L,
            "prefill": vec(L), "decode": vec(L), "prefill_std": vec(L), "decode_std": vec(L),
            "prefill_samples": [vec(L) for _ in range(N)],
            "decode_samples": [vec(L) for _ in range(N)], "block_influence": stages(),
            "loo": stages(), "rank_corr": {"prefill": 0.5, "decode": 0.7}, "seconds": 60.0,
            "samples_per_s": 0.3, "config": {}, "shape": shape, "fingerprint": "x" * 64,
            "prompt_tokens": [40] * N, "response_tokens": [64] * N, "loss": vec(N),
            "loo_taylor": stages()}


def drift() -> dict:
    d = {"model": "smollm2-135m", "skip_layers": list(range(20, 30)), "n_layers": L,
         "prompt_tokens": 1024, "kl": vec(K), "top1_agree": vec(K), "tokens": ["x"] * T,
         "token_positions": list(range(T)), "decode_tokens": list(range(K)), "n_prompts": 1,
         "config": {}, "seconds": 3.0,
         "quantiles": {q: {p: vec(L) for p in ("0.1", "0.25", "0.5")}
                       for q in ("hidden", "k", "v", "attn_out")}}
    for q in ("hidden", "k", "v", "attn_out"):
        d[f"{q}_cos"], d[f"{q}_min"] = vec(L), vec(L)
        d[f"{q}_tok"] = [vec(K if q == "attn_out" else T) for _ in range(L)]
    return d


def sweep() -> dict:
    from pop_analysis.store.schema import SweepRow

    rows = [SweepRow(v, 1 / 3, list(range(20, 30)), 1.3, 1.45, 0.9, 0.8, kind="ablation",
                     n=64).to_dict() for v in ("full", "pop", "shallow", "interleaved",
                                              "pop_no_kv", "pop_no_boundary", "static")]
    return {"model": "smollm2-135m", "kind": "ablation", "rows": rows, "config": {},
            "seconds": 600.0, "data": "gsm8k", "threads": 2, "device": "cpu"}


def timed(fn, repeats: int = 300) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": round(statistics.median(times), 3),
            "p90_ms": round(times[int(0.9 * len(times))], 3)}


def main() -> None:
    random.seed(0)
    os.environ["POP_LAB_CACHE"] = tempfile.mkdtemp()
    from pop_analysis.experiments.sweep import SweepResult
    from pop_analysis.importance.calibrate import CalibrationResult
    from pop_analysis.inspection.drift import DriftResult
    from pop_analysis.store import results as store
    from pop_analysis.store.records import check

    out = {}
    for kind, cls, payload in (("calibration", CalibrationResult, calibration()),
                               ("drift", DriftResult, drift()), ("sweep", SweepResult, sweep())):
        key = store.make_key({"bench": kind})
        path = store.save(kind, key, payload)
        plain = json.loads(path.read_text())["payload"]
        assert store.load_record(kind, key, cls, L) is not None
        out[kind] = {"bytes": path.stat().st_size,
                     "check": timed(lambda: check(kind, cls, plain, L)),
                     "load": timed(lambda: store.load_record(kind, key, cls, L))}
    from bench_results import save

    save("record_check_bench", {}, out)


if __name__ == "__main__":
    main()
