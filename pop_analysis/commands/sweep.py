"""Sweep skip ratios, ablations, prompt lengths or adaptive skip sets (the paper's tables)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pop_analysis.commands._common import (
    COUNT,
    MAX_TOKENS,
    RATIO,
    SEED,
    TOKENS,
    Num,
    NumList,
    add_model_args,
    emit_json,
    load,
    quiet_hf,
    seconds,
    writable,
)
from pop_analysis.commands._repair import add_repair_arg
from pop_analysis.experiments.sweep import (
    DEFAULT_SAMPLES,
    KINDS,
    SweepConfig,
    SweepError,
    cached_sweep,
    write_csv,
)
from pop_analysis.progress import terminal_bar
from pop_analysis.quality.evalsets import check_size
from pop_analysis.speed.timing import (
    MAX_BUDGET_S,
    MAX_ROUNDS,
    TimingError,
    check_budget,
    check_rounds,
)

SHOWN = ["kind", "variant", "skip_ratio", "length", "n", "prefill_speedup", "speedup_range",
         "ideal_speedup", "roofline_speedup", "timing_trustworthy", "continuation_nll", "next_token_kl", "next_token_top1", "greedy_agreement", "exact_match",
         "retrieval_acc", "full_retrieval_acc"]
WITH_CI = ("continuation_nll", "next_token_kl", "next_token_top1", "greedy_agreement",
           "exact_match", "retrieval_acc", "full_retrieval_acc")


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--kind", default="auto", choices=("auto", "all") + KINDS,
                   help="which sweep; auto runs those whose option is given (ratio when none)")
    p.add_argument("--dataset", default="gsm8k",
                   help="gsm8k, wizardlm, selfinstruct, retrieval[:LENGTH], builtin or a .jsonl file")
    p.add_argument("--samples", type=COUNT, default=DEFAULT_SAMPLES,
                   help=f"evaluation items (default {DEFAULT_SAMPLES}: POP's NLL difference from "
                        "the full model on GSM8K then has a 95%% interval narrower than 0.05 nats)")
    p.add_argument("--ratios", type=NumList(RATIO), default=None, help="comma list, e.g. 0,0.2,0.25,0.33,0.4,0.5,0.6")
    p.add_argument("--variants", default=None,
                   help="comma list of full,pop,shallow,interleaved,pop_no_kv,pop_no_boundary,"
                        "static,pop_repair")
    p.add_argument("--lengths", type=NumList(TOKENS), default=None, help="comma list of prompt lengths, e.g. 32,128,512,2048")
    p.add_argument("--calibration", default=None,
                   help="store key of a calibration (or a JSON file with a 'prefill' list): "
                        "adds the adaptive-vs-contiguous sweep")
    p.add_argument("--max-new-tokens", type=TOKENS, default=32, help="greedy tokens compared")
    p.add_argument("--repeats", type=Num(int, 1, MAX_ROUNDS), default=3,
                   help="fewest timed rounds per speedup (at least 3 are run)")
    p.add_argument("--timing-budget", type=seconds(MAX_BUDGET_S), default=2.0, metavar="SECONDS",
                   help="more timing rounds per speedup while they fit in this many seconds")
    p.add_argument("--bench-tokens", type=Num(int, 2, MAX_TOKENS), default=512,
                   help="prompt length of the timed speedup")
    p.add_argument("--task-accuracy", action="store_true", help="also score GSM8K exact match")
    p.add_argument("--no-greedy", action="store_true",
                   help="teacher-forced metrics only (NLL, KL, top-1): no greedy decoding, "
                        "several times faster (retrieval still decodes its answer)")
    p.add_argument("--seed", type=SEED, default=0, help="retrieval task seed")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the rows as CSV")
    p.add_argument("--no-cache", action="store_true", help="recompute even when cached")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_repair_arg(p)  # ratio sweep: a pop_repair row beside each pop row; ablation: pop_repair


def config_from_args(args) -> SweepConfig:
    if args.samples < 1 or args.max_new_tokens < 1 or args.bench_tokens < 2:
        raise SweepError("--samples and --max-new-tokens must be >= 1, --bench-tokens >= 2")
    try:
        check_rounds(args.repeats)
        check_budget(args.timing_budget)
    except TimingError as e:
        raise SweepError(str(e)) from None
    kw = {}
    if args.ratios:
        kw["ratios"] = tuple(args.ratios)
    if args.variants:
        kw["variants"] = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    if args.lengths:
        kw["lengths"] = tuple(args.lengths)
    return SweepConfig(dataset=args.dataset, n_samples=args.samples,
                       max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                       timing_budget_s=args.timing_budget,
                       bench_tokens=args.bench_tokens, task_accuracy=args.task_accuracy,
                       greedy=not args.no_greedy,
                       seed=args.seed, repair=args.repair, **kw)


def kinds_from_args(args) -> list[str]:
    if args.kind == "all":
        return ["ratio", "ablation", "length"] + (["adaptive"] if args.calibration else [])
    if args.kind != "auto":
        return [args.kind]
    picked = [k for k, opt in (("ratio", args.ratios), ("ablation", args.variants),
                               ("length", args.lengths), ("adaptive", args.calibration)) if opt]
    return picked or ["ratio"]


def load_calibration_arg(text: str | None):
    """A calibration payload from the store (by key) or a JSON file."""
    if text is None:
        return None
    path = Path(text).expanduser()
    if path.is_file():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise SweepError(f"{path}: not valid JSON ({e})") from None
    from pop_analysis.importance.calibrate import load_calibration

    payload = load_calibration(text)
    if payload is None:
        raise SweepError(f"no calibration {text!r}: not a JSON file nor a key in the store")
    return payload


def run(args) -> int:
    quiet_hf()
    cfg = config_from_args(args)
    kinds = kinds_from_args(args)
    if args.csv:
        writable(args.csv, "--csv")  # before the sweep, not after it
    calibration = load_calibration_arg(args.calibration)
    if "adaptive" in kinds and calibration is None:
        raise SweepError("the adaptive sweep needs --calibration KEY_OR_FILE")
    for data in {"retrieval" if k == "length" else cfg.dataset for k in kinds}:
        check_size(data, cfg.n_samples)  # before the model loads; says how many it holds
    lm = load(args)
    bar = None if args.quiet or args.json else terminal_bar
    results, out = [], {"model": lm.name, "rows": [], "sweeps": []}
    for kind in kinds:
        res, hit = cached_sweep(lm, kind, cfg, not args.no_cache, bar, calibration)
        results.append(res)
        for note in res.notes:
            print(f"note: {note}", file=sys.stderr)
        out["rows"].extend(res.rows)
        out["sweeps"].append({"kind": kind, "cached": hit, "seconds": res.seconds,
                              "data": res.data, "threads": res.threads, "device": res.device,
                              "config": res.config, "notes": res.notes})
        if not args.json:
            _print(res, hit)
    if args.csv:
        write_csv(results, args.csv)
    if args.json:
        emit_json(out)
    return 0


def _print(res, hit: bool) -> None:
    df = res.to_frame()
    for c in WITH_CI:  # "0.512 [0.47, 0.55]": the number with its 95% interval
        if f"{c}_ci" in df.columns and c in df.columns:
            df[c] = [_with_ci(v, ci) for v, ci in zip(df[c], df[f"{c}_ci"])]
    cols = [c for c in SHOWN if c in df.columns and df[c].notna().any()]
    print(f"\n{res.kind} sweep on {res.model} ({res.data}; {res.threads} threads; "
          f"{'cached' if hit else f'{res.seconds:.0f} s'})")
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def _with_ci(value, ci) -> str | None:
    if value is None or value != value:
        return None
    if not isinstance(ci, (list, tuple)):
        return f"{value:.3f}"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
