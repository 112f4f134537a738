"""Calibration speed of the one-pass path (fisher.py), the figures in docs/benchmarks.md.

    python bench/calibrate_bench.py speed --dataset wizardlm --prompts 16 --rounds 3
    python bench/calibrate_bench.py speed --dataset builtin --prompts 200 --rounds 1
    python bench/calibrate_bench.py bf16 --dataset wizardlm --prompts 64

speed: after a 2-prompt warm-up, --rounds timed runs on the same prompts (calibrate() never reads
  the results store: the CLI's --no-cache); the median, the range, samples/s of the median. (The
  algorithm it replaced was timed side by side with it when the one-pass path was adopted; the
  figures stay in docs/benchmarks.md, the old code is in git history.)
bf16: the current path in fp32 and under CPU bfloat16 autocast on the same prompts; Spearman
  (scipy) of the per-layer importance of both stages, and the speed of each (one run each).
batch: the current path with each of --sizes as batch size on the same prompts, two rounds in
  opposite orders (one warm-up first): seconds and samples/s (mean of the two) per size; and the
  bytes autograd keeps for one batch of that size (batch_plan.py's memory estimate rests on it).
Each prints one JSON object with the conditions: threads, load average, other processes' CPU use.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from scipy.stats import spearmanr

from pop_analysis.data.prompts import load_prompts, make_set
from pop_analysis.engine.models import load_model
from pop_analysis.importance.batch_plan import kept_floats
from pop_analysis.importance.calibrate import CalibrationConfig, calibrate
from pop_analysis.speed.machine import matmul_rate
from pop_analysis.speed.timing import other_cpu_seconds_but_ours
from pop_analysis.store.paths import shared_data_dir

DATASETS = {"wizardlm": lambda: str(shared_data_dir() / "wizardlm_testset.jsonl")}


def prompt_set(name: str, n: int):
    """The first n prompts of a set, cycled when the set is shorter (200 built-in prompts)."""
    src = load_prompts(DATASETS.get(name, lambda: name)())
    return make_set(src.name, [src.prompts[i % len(src)] for i in range(n)])


def conditions(other_cores=None) -> dict:
    return {"threads": torch.get_num_threads(), "load_avg_1min": round(os.getloadavg()[0], 2),
            "other_cores": None if other_cores is None else round(other_cores, 2),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "torch": torch.__version__}


def agreement(new, old_prefill, old_decode) -> dict:
    """How the current path's scores compare with another run's: rank agreement of the layer
    means (scipy Spearman) and the largest per-sample difference relative to the scale."""
    out = {}
    for stage, old in (("prefill", old_prefill), ("decode", old_decode)):
        cur = torch.tensor(getattr(new, f"{stage}_samples"), dtype=torch.float64)  # (n, L)
        out[f"{stage}_spearman"] = round(float(spearmanr(cur.mean(0), old.mean(0))[0]), 5)
        out[f"{stage}_max_rel_diff"] = float((cur - old).abs().max() / old.abs().max())
    return out


def speed(lm, args) -> dict:
    cfg = CalibrationConfig(n_samples=args.prompts, max_new_tokens=args.max_new_tokens,
                            seed=args.seed, batch_size=args.batch_size)
    prompts = prompt_set(args.dataset, args.prompts)
    got: dict = {}

    def current():
        got["new"] = calibrate(lm, prompts, cfg)

    row = {"dataset": prompts.name, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
           "seed": args.seed, "batch_size": args.batch_size, "dtype": "float32",
           "load_avg_before": round(os.getloadavg()[0], 2)}
    calibrate(lm, prompts, CalibrationConfig(n_samples=2, max_new_tokens=4, seed=args.seed))
    seconds, cpu0 = [], other_cpu_seconds_but_ours()
    t_all = time.perf_counter()
    for _ in range(max(1, args.rounds)):
        t0 = time.perf_counter()
        current()
        seconds.append(time.perf_counter() - t0)
    cpu1, wall = other_cpu_seconds_but_ours(), time.perf_counter() - t_all
    other = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / wall  # cores of other work
    mid = statistics.median(seconds)
    row.update(seconds=[round(x, 2) for x in seconds], median_seconds=round(mid, 2),
               samples_per_s=round(args.prompts / mid, 3), rounds=len(seconds),
               **conditions(other))
    new = got["new"]
    row["mean_prompt_tokens"] = sum(new.prompt_tokens) / len(new.prompt_tokens)
    row["mean_response_tokens"] = sum(new.response_tokens) / len(new.response_tokens)
    return row


def bf16(lm, args) -> dict:
    cfg = CalibrationConfig(n_samples=args.prompts, max_new_tokens=args.max_new_tokens,
                            seed=args.seed, batch_size=args.batch_size)
    prompts = prompt_set(args.dataset, args.prompts)
    warm = CalibrationConfig(n_samples=2, max_new_tokens=4, seed=args.seed)
    runs = {}
    for name in ("fp32", "bf16"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
            calibrate(lm, prompts, warm)
            t0 = time.perf_counter()
            runs[name] = calibrate(lm, prompts, cfg)
            runs[name + "_s"] = time.perf_counter() - t0
    ref = runs["fp32"]
    agree = agreement(runs["bf16"], torch.tensor(ref.prefill_samples, dtype=torch.float64),
                      torch.tensor(ref.decode_samples, dtype=torch.float64))
    shape = (lm.adapter.shape.hidden, lm.adapter.shape.intermediate)
    rates = {f"{dt}_gflops_{rows}_rows": round(matmul_rate("cpu", dtype, shape, rows) / 1e9, 1)
             for dt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
             for rows in (16, 1024)}
    return {"dataset": prompts.name, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
            "seed": args.seed, "batch_size": args.batch_size,
            "fp32_seconds": round(runs["fp32_s"], 2), "bf16_seconds": round(runs["bf16_s"], 2),
            "fp32_samples_per_s": round(args.prompts / runs["fp32_s"], 3),
            "bf16_samples_per_s": round(args.prompts / runs["bf16_s"], 3),
            "same_response_lengths": sum(a == b for a, b in zip(ref.response_tokens,
                                                                runs["bf16"].response_tokens)),
            **agree, "keep": min(agree["prefill_spearman"], agree["decode_spearman"]) >= 0.99,
            **rates, **conditions()}


def saved_bytes(lm, run) -> int:
    """Bytes of the tensors autograd keeps for backward during run() (unique storages, the
    model's own weights excluded): what a batch's graph adds to memory at its peak."""
    weights = {p.untyped_storage().data_ptr() for p in lm.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in weights:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def batch_sizes(lm, args) -> dict:
    """Speed per batch size on the same prompts (two rounds, opposite orders) and the memory one
    batch's graph takes (saved tensors of a run whose only batch has that size)."""
    prompts = prompt_set(args.dataset, args.prompts)
    calibrate(lm, prompts, CalibrationConfig(n_samples=2, max_new_tokens=4, seed=args.seed))
    sizes = [int(x) for x in args.sizes.split(",")]
    runs: dict[int, list] = {s: [] for s in sizes}
    for order in (sizes, sizes[::-1]) if args.rounds else ():  # --rounds 0: memory only
        for size in order:
            cfg = CalibrationConfig(n_samples=args.prompts, max_new_tokens=args.max_new_tokens,
                                    seed=args.seed, batch_size=size)
            t0 = time.perf_counter()
            calibrate(lm, prompts, cfg)
            runs[size].append(time.perf_counter() - t0)
    rows = []
    shape = lm.adapter.shape
    for size in sizes:
        one = CalibrationConfig(n_samples=min(size, args.prompts), seed=args.seed,
                                max_new_tokens=args.max_new_tokens, batch_size=size)
        got = {}
        graph = saved_bytes(lm, lambda: got.setdefault("r", calibrate(lm, prompts, one)))
        r = got["r"]
        tokens = len(r.prompt_tokens) * (max(r.prompt_tokens) + max(r.response_tokens))
        secs = sorted(runs[size])
        rows.append({"batch_size": size, "seconds": [round(x, 2) for x in secs],
                     "samples_per_s": round(args.prompts / (sum(secs) / len(secs)), 3)
                     if secs else None,
                     "graph_gib": round(graph / 2 ** 30, 3), "padded_tokens": tokens,
                     "floats_per_token_layer_width": round(kept_floats(shape, graph, tokens), 2)})
    return {"dataset": prompts.name, "prompts": args.prompts,
            "max_new_tokens": args.max_new_tokens, "seed": args.seed, "sizes": rows,
            **conditions()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("speed", "bf16", "batch"))
    ap.add_argument("--dataset", default="wizardlm", help="wizardlm, builtin, or a prompt file")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="8,16,32,64", help="batch sizes compared by 'batch'")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of both paths (0: new only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(device="cpu")
    run = {"speed": speed, "bf16": bf16, "batch": batch_sizes}[args.what]
    from bench_results import save

    save("calibrate_bench", args, run(lm, args), what=args.what)


if __name__ == "__main__":
    main()
