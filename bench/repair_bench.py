"""Does the closed-form K/V repair help on prompts its fit never saw? (docs/repair.md)

Two repairs per skip ratio: "builtin" (the 64 builtin prompts, the default) and "gsm8k_train"
(96 GSM8K train questions with their answers). Held-out evaluation, never the fitting prompts:
GSM8K test answers, WizardLM test instructions (continuation: the full model's greedy response),
the synthetic retrieval task, and drift on GSM8K test questions. Each stage is one short run
(on an otherwise quiet machine) and writes bench/raw/repair_bench/<stage>_<ratio>[_data]__<every
parameter>__<UTC start>.json (a new file per run; the report reads each stage's newest):

    python bench/repair_bench.py fit --ratio 0.33
    python bench/repair_bench.py quality --ratio 0.33 --data gsm8k --samples 64
    python bench/repair_bench.py quality --ratio 0.33 --data wizardlm --samples 48
    python bench/repair_bench.py quality --ratio 0.33 --data retrieval:512 --samples 24
    python bench/repair_bench.py drift --ratio 0.33 --samples 8
    python bench/repair_bench.py report        # markdown tables of everything measured
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.models import load_model
from pop_analysis.engine.skipset import describe, last_block
from pop_analysis.inspection.drift import DriftConfig, average, drift
from pop_analysis.quality.evalsets import NAMED, data_dir, load_eval_set, read_records
from pop_analysis.repair.evaluate import compare, summary
from pop_analysis.repair.fit import RepairConfig
from pop_analysis.repair.store import attach, fit_and_store, memory
from pop_vllm.run_setting import RunSetting

from bench_results import RAW, RawFile

OUT = RAW / "repair_bench"
_RUN: dict = {}  # what -> this run's raw output file
REPAIRS = {"builtin": RepairConfig(),
           "gsm8k_train": RepairConfig(data="gsm8k_train", n_samples=96, answers=True)}


def write(name: str, payload: dict, args) -> None:
    payload = {**payload, "threads": torch.get_num_threads(), "load": os.getloadavg()}
    if name not in _RUN:
        _RUN[name] = RawFile("repair_bench", args, what=name)
    _RUN[name].write(payload)
    print(json.dumps({k: v for k, v in payload.items() if k not in ("summary", "per_item")})[:600])


def repairs(lm, skip) -> dict:
    """The stored repairs (fitted on a miss) for this skip set."""
    return {name: fit_and_store(lm, skip, cfg)[0] for name, cfg in REPAIRS.items()}


def calibration_texts() -> set[str]:
    texts = set(load_prompts("builtin", limit=REPAIRS["builtin"].n_samples).prompts)
    recs = read_records(data_dir() / NAMED["gsm8k_train"])[: REPAIRS["gsm8k_train"].n_samples]
    return texts | {r["question"] for r in recs}


def stage_fit(lm, skip, args) -> None:
    out = {}
    for name, cfg in REPAIRS.items():
        t0 = time.perf_counter()
        rep, stored = fit_and_store(lm, skip, cfg, use_cache=not args.refit)
        out[name] = {"key": rep.key, "stored": stored, "wall_s": time.perf_counter() - t0,
                     "seconds": rep.info["seconds"], "collect_s": rep.info["collect_s"],
                     "n_tokens": rep.info["n_tokens"], "fit": rep.info["fit"], **memory(lm, rep)}
    write(f"fit_{args.ratio}", {"skip": list(skip), "repairs": out}, args)


def stage_quality(lm, skip, args) -> None:
    evalset = load_eval_set(lm, args.data, args.samples, seed=args.seed)
    leaked = {it.text for it in evalset.items} & calibration_texts()
    if leaked:
        raise SystemExit(f"{len(leaked)} evaluation prompt(s) are calibration prompts")
    retrieval = evalset.kind == "retrieval"
    t0 = time.perf_counter()
    scores = compare(lm, evalset.items, skip, repairs(lm, skip), args.max_new_tokens,
                     generate=retrieval)
    per_item = {n: {"continuation_nll": s.continuation_nll, "next_token_kl": s.next_token_kl,
                    "answer_correct": s.answer_correct} for n, s in scores.items()}
    write(f"quality_{args.ratio}_{args.data.replace(':', '-')}",
          {"skip": list(skip), "data": args.data, "n": len(evalset.items),
           "seconds": time.perf_counter() - t0,
           "summary": summary(scores, "retrieval_acc" if retrieval else None),
           "per_item": per_item}, args)


def stage_drift(lm, skip, args) -> None:
    recs = read_records(data_dir() / NAMED["gsm8k"])[: args.samples]
    from pop_analysis.engine.generate import encode

    prompts = [encode(lm, r["question"]) for r in recs]
    cfg = DriftConfig(decode_steps=8)

    def block(runs) -> dict:
        avg = average(runs)
        layers = {q: [getattr(avg, f"{q}_cos")[i] for i in skip] for q in ("k", "v", "attn_out")}
        per_prompt = [{**r.block_means(), "kl": sum(r.kl) / len(r.kl)} for r in runs]  # paired
        return {**avg.block_means(), "kl": sum(p["kl"] for p in per_prompt) / len(runs),
                "layers": layers, "per_prompt": per_prompt}

    out = {"pop": block([drift(lm, ids, RunSetting(skip), cfg) for ids in prompts])}
    for name, rep in repairs(lm, skip).items():
        attach(lm, rep, skip)
        out[name] = block([drift(lm, ids, RunSetting(skip, "pop_repair"), cfg) for ids in prompts])
    write(f"drift_{args.ratio}", {"skip": list(skip), "n": len(prompts), "block_means": out}, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("fit", "quality", "drift", "report"))
    p.add_argument("--ratio", type=float, default=0.33)
    p.add_argument("--data", default="gsm8k")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy continuation length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--refit", action="store_true", help="fit again even when stored")
    args = p.parse_args()
    if args.stage == "report":
        from repair_report import report

        print(report(OUT))
        return
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu")
    skip = last_block(lm.adapter.n_layers, args.ratio)
    print(f"skip {describe(skip)}", file=sys.stderr)
    {"fit": stage_fit, "quality": stage_quality, "drift": stage_drift}[args.stage](lm, skip, args)


if __name__ == "__main__":
    main()
