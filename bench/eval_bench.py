"""Evaluation speed and the per-item spread that sets the default sample count, in one process.

    python bench/eval_bench.py --items 16 --spread-items 100 --threads 2

1. Throughput: the batched path (pop_analysis.quality.evaluate.evaluate_variants: left-padded batches,
   the full model's pass shared by every variant) against the item-by-item path the sweeps used
   before it (per item and variant: one prefill + teacher forcing of the reference, one greedy
   generation; the full model's greedy reference once per item). Same items, variants, new tokens
   and threads; the two paths alternate (old, new, new, old) and each time is reported.
   Items/s counts item x variant evaluations.
2. Spread: per-item difference of POP's continuation NLL from the full model's on GSM8K answers
   (teacher-forced only); its standard deviation gives the n at which the 95% interval of the
   mean difference is narrower than --width nats.
Prints one JSON object.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pop_analysis.engine.models import load_model
from pop_analysis.engine.skipset import preset
from pop_analysis.quality.answers import answer_matches
from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.quality.metrics import agreement, greedy_tokens, score_continuations
from pop_analysis.quality.stats import paired_delta, required_n
from pop_vllm.run_setting import RunSetting


def item_by_item(lm, items, variants, max_new_tokens) -> None:
    """The sweeps' evaluation before batching, step for step."""
    refs = [greedy_tokens(lm, it.prompt_ids, RunSetting.full(), max_new_tokens) for it in items]
    for v in variants:
        for it, ref in zip(items, refs):
            cont = list(it.reference_ids) or ref
            score_continuations(lm, it.prompt_ids, [cont], v.setting)
            out = ref if not v.setting.active else greedy_tokens(lm, it.prompt_ids, v.setting,
                                                                 max_new_tokens)
            agreement(ref, out)
            if it.answer is not None:
                answer_matches(lm.tokenizer.decode(out, skip_special_tokens=True), it.answer)


def throughput(lm, items, variants, max_new_tokens) -> dict:
    runs = {"item_by_item": [], "batched": []}
    for path in ("item_by_item", "batched", "batched", "item_by_item"):
        t0 = time.perf_counter()
        if path == "batched":
            evaluate_variants(lm, items, variants, max_new_tokens)
        else:
            item_by_item(lm, items, variants, max_new_tokens)
        runs[path].append(time.perf_counter() - t0)
    work = len(items) * len(variants)
    out = {p: {"seconds": [round(s, 1) for s in ts], "items_per_s": round(work / statistics.median(ts), 3)}
           for p, ts in runs.items()}
    out["speedup"] = round(statistics.median(runs["item_by_item"]) / statistics.median(runs["batched"]), 2)
    return out


def spread(lm, n: int, width: float) -> dict:
    items = load_eval_set(lm, "gsm8k", n).items
    pop = Arm("pop", RunSetting(preset("paper", lm.adapter.n_layers)))
    t0 = time.perf_counter()
    scores = evaluate_variants(lm, items, [pop], generate=False)
    seconds = time.perf_counter() - t0
    diff = [a - b for a, b in zip(scores["pop"].continuation_nll, scores["full"].continuation_nll)]
    sd = statistics.stdev(diff)
    d = paired_delta(scores["pop"].continuation_nll, scores["full"].continuation_nll)
    return {"n": n, "mean_delta_nll": round(d.value, 4), "delta_ci": [round(x, 4) for x in d.ci],
            "ci_width": round(d.width, 4), "sd_delta_nll": round(sd, 4), "target_width": width,
            "required_n": required_n(sd, width), "seconds_teacher_forced_2_variants": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=16, help="GSM8K items timed on both paths")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--spread-items", type=int, default=100, help="0 skips the spread part")
    ap.add_argument("--width", type=float, default=0.05, help="target 95%% interval width, nats")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", device="cpu")
    skip = preset("paper", lm.adapter.n_layers)
    variants = [FULL, Arm("pop", RunSetting(skip)), Arm("static", RunSetting(skip, "static"))]
    items = load_eval_set(lm, "gsm8k", args.items).items
    out = {"model": lm.name, "threads": torch.get_num_threads(), "items": len(items),
           "variants": [v.name for v in variants], "max_new_tokens": args.max_new_tokens,
           "throughput": throughput(lm, items, variants, args.max_new_tokens)}
    if args.spread_items:
        out["spread"] = spread(lm, args.spread_items, args.width)
    from bench_results import save

    save("eval_bench", args, out)


if __name__ == "__main__":
    main()
