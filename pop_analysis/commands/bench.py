"""Time TTFT of the full model and POP at several prompt lengths (the timing protocol)."""
from __future__ import annotations

from pop_analysis.commands._common import (
    TOKENS,
    Num,
    NumList,
    add_model_args,
    add_skip_args,
    emit_json,
    load,
    quiet_hf,
    seconds,
    skip_from_args,
)
from pop_analysis.commands._repair import add_repair_arg, attach_repair
from pop_analysis.speed.bench import bench
from pop_analysis.speed.timing import MAX_BUDGET_S, MAX_ROUNDS, check_budget, check_rounds
from pop_vllm.run_setting import RunSetting


def add_arguments(p) -> None:
    add_model_args(p)
    add_skip_args(p, default_ratio=0.33)
    p.add_argument("--lengths", type=NumList(TOKENS), default="32,128,512,2048",
                   help="comma list of prompt lengths")
    p.add_argument("--repeats", type=Num(int, 1, MAX_ROUNDS), default=3,
                   help="fewest timed rounds per length (at least 3 are run)")
    p.add_argument("--timing-budget", type=seconds(MAX_BUDGET_S), default=10.0, metavar="SECONDS",
                   help="more rounds while their time stays within this (per length)")
    p.add_argument("--with-hf", action="store_true", help="also time HF's own forward")
    add_repair_arg(p)  # also time pop_repair against pop (same protocol) at each length


def run(args) -> int:
    quiet_hf()
    lengths = args.lengths
    check_rounds(args.repeats)
    check_budget(args.timing_budget)
    lm = load(args)
    skip = skip_from_args(args, lm.adapter.n_layers)
    import torch

    threads = torch.get_num_threads()
    show = None if args.json else _line
    rep = attach_repair(args, lm, skip, quiet=args.json)
    rows = bench(lm, lengths, skip, args.repeats, args.timing_budget, with_hf=args.with_hf,
                 on_row=show)
    out = [r.as_dict() for r in rows]
    if rep:
        for row in out:
            row["pop_repair"] = repair_timing(lm, row["length"], skip, args)
            if show:
                _repair_line(row["pop_repair"])
    if args.json:
        emit_json({"model": lm.name, "threads": threads, "skip_layers": list(skip),
                   "repeats": args.repeats, "timing_budget_s": args.timing_budget,
                   "repair": rep.key if rep else None, "rows": out})
    return 0


def repair_timing(lm, length: int, skip, args) -> dict:
    """TTFT of pop_repair against pop itself, through the same protocol (ratio pop / repaired:
    1.0 = the same cost)."""
    from pop_analysis.speed.bench import first_token, random_prompt, time_prefill
    from pop_analysis.speed.timing import TimingConfig

    ids = random_prompt(lm, length)
    cfg = TimingConfig(min_rounds=args.repeats, budget_s=args.timing_budget)
    pop = RunSetting(skip)
    t = time_prefill(lm, ids, pop.replace(variant="pop_repair"), cfg,
                     full=lambda: first_token(lm, ids, pop)).timing
    return {"ttft_pop_ms": round(t.full_median_ms, 3), "ttft_ms": round(t.variant_median_ms, 3),
            "pop_over_repair": round(t.speedup, 4), **t.fields()}


def _repair_line(r: dict) -> None:
    lo, hi = r["speedup_range"]
    flag = "" if r["timing_trustworthy"] else f"  NOT TRUSTWORTHY: {r['timing_note']}"
    print(f"        pop_repair {r['ttft_ms']:8.1f} ms vs pop {r['ttft_pop_ms']:8.1f} ms: "
          f"pop/pop_repair {r['pop_over_repair']:.3f} [{lo:.3f}-{hi:.3f}, "
          f"{r['timing_rounds']} rounds]{flag}")


def _line(r) -> None:
    lo, hi = r.speedup_range
    flag = "" if r.timing_trustworthy else f"  NOT TRUSTWORTHY: {r.timing_note}"
    print(f"{r.length:>6} tokens: full {r.ttft_full_ms:8.1f} ms  pop {r.ttft_pop_ms:8.1f} ms  "
          f"speedup {r.speedup:.2f}x [{lo:.2f}-{hi:.2f}, {r.timing_rounds} rounds] "
          f"(ideal {r.ideal_speedup:.2f}x FLOPs, {r.roofline_speedup:.2f}x roofline){flag}")
