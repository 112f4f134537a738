"""Calibration speed: the batched path against a naive one-prompt-at-a-time loop, in one process.

    python bench/calibrate_bench.py --prompts 200 --max-new-tokens 64 --threads 2 --naive 8

The batched path is pop_analysis.calibrate.calibrate (batched sampling with a cache, one gated
forward + backward per batch, no weight gradients). The naive loop does per prompt what a direct
implementation would: pop_analysis.generate.run to sample, then one gated forward + backward of
the HF model with logits at every position and weight gradients on. Both use the same prompts,
sampling settings and thread count; the naive loop runs on the first --naive prompts only and is
reported per sample. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from pop_analysis.calibrate import CalibrationConfig, calibrate, pack, sample_seed  # noqa: E402
from pop_analysis.data import load_prompts, make_set  # noqa: E402
from pop_analysis.gates import DECODE, StageGates, gated  # noqa: E402
from pop_analysis.generate import SamplingConfig, encode  # noqa: E402
from pop_analysis.generate import run as run_generation  # noqa: E402
from pop_analysis.models import load_model  # noqa: E402


def naive_sample(lm, text: str, cfg: CalibrationConfig, index: int) -> float:
    """One prompt: batch-1 sampling, then a full-vocabulary gated forward + backward."""
    ids = encode(lm, text)
    scfg = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                          top_p=cfg.top_p, seed=sample_seed(cfg.seed, index))
    t0 = time.perf_counter()
    response = run_generation(lm, ids, "full", cfg=scfg).token_ids
    batch = pack([ids], [response])
    gates = StageGates.ones(1, lm.adapter.n_layers)
    with torch.enable_grad(), gated(lm.adapter, gates, batch.stages):
        logits = lm.model(input_ids=batch.ids).logits[0, :-1].float()  # (T-1, V)
        targets = batch.ids[0, 1:]  # (T-1,)
        keep = batch.stages[0, :-1] == DECODE  # (T-1,)
        loss = torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
        loss.backward()
    lm.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="builtin")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--naive", type=int, default=8, help="prompts timed with the naive loop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(device="cpu")
    prompts = load_prompts(args.dataset)
    texts = [prompts.prompts[i % len(prompts)] for i in range(args.prompts)]
    cfg = CalibrationConfig(n_samples=args.prompts, max_new_tokens=args.max_new_tokens,
                            batch_size=args.batch_size)
    run_set = make_set(prompts.name, texts)
    naive_s = [naive_sample(lm, texts[i], cfg, i) for i in range(args.naive)]
    t0 = time.perf_counter()
    result = calibrate(lm, run_set, cfg)
    batched_s = time.perf_counter() - t0
    naive_per = sum(naive_s) / len(naive_s) if naive_s else None
    per = batched_s / args.prompts
    print(json.dumps({
        "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_avg_1min": os.getloadavg()[0], "dataset": prompts.name, "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "mean_prompt_tokens": sum(result.prompt_tokens) / args.prompts,
        "mean_response_tokens": sum(result.response_tokens) / args.prompts,
        "batched_seconds": round(batched_s, 2), "batched_s_per_sample": round(per, 3),
        "samples_per_s": round(args.prompts / batched_s, 3),
        "naive_samples": args.naive, "naive_s_per_sample": round(naive_per, 3) if naive_per else None,
        "speedup_vs_naive": round(naive_per / per, 2) if naive_per else None,
    }))


if __name__ == "__main__":
    main()
