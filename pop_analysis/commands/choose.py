"""The largest skip set that keeps POP inside a quality budget (judged on the 95% interval's
bound), searched along one method's ranking and measured on held-out items."""
from __future__ import annotations

import sys

from pop_analysis.commands._common import Num, add_model_args, emit_json, load, quiet_hf
from pop_analysis.commands._importance import (
    add_eval_args,
    add_ranking_args,
    ranking,
    ranking_config,
)
from pop_analysis.experiments.choose import Budget, ChooseConfig, cached_choice
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES
from pop_analysis.progress import terminal_bar


def add_arguments(p) -> None:
    add_model_args(p)
    d = ChooseConfig()
    p.add_argument("--max-delta-nll", type=Num(float, 0.0, 1e6), default=None,
                   help="the upper 95%% bound of ΔNLL vs the full model must stay at or below this")
    p.add_argument("--min-top1", type=Num(float, 0.0, 1.0), default=None,
                   help="the lower 95%% bound of top-1 agreement with the full model must stay at "
                        "or above this (e.g. 0.9)")
    p.add_argument("--method", default=d.method, help=f"whose ranking: {', '.join(METHODS)}")
    p.add_argument("--shape", default=d.shape, choices=SHAPES,
                   help="free: any layers; block: one contiguous block")
    p.add_argument("--probes", type=Num(int, 1, 64), default=d.probes, help="set sizes per bisection round")
    p.add_argument("--refine", type=Num(int, 0, 64), default=d.refine, help="candidates per refinement round")
    p.add_argument("--max-candidates", type=Num(int, 1, 10_000), default=d.max_candidates,
                   help="the most sets measured")
    add_ranking_args(p)
    add_eval_args(p, samples=d.n_samples)


def run(args) -> int:
    quiet_hf()
    budget = Budget(args.max_delta_nll, args.min_top1)  # bad input fails before loading
    cfg = ChooseConfig(method=args.method, shape=args.shape, dataset=args.eval_dataset,
                       n_samples=args.eval_samples, offset=args.offset,
                       answer_tokens=args.answer_tokens, probes=args.probes, refine=args.refine,
                       max_candidates=args.max_candidates, speed=not args.no_speed,
                       bench_tokens=args.bench_tokens)
    rcfg = ranking_config(args, [args.method])
    lm = load(args)
    bar = None if args.quiet or args.json else terminal_bar
    importance, _ = ranking(args, lm, rcfg, bar)
    res, hit = cached_choice(lm, importance, budget, cfg, not args.no_cache, bar)
    if args.json:
        emit_json({"skip_layers": res.chosen, "met": res.met, "ideal_speedup": res.ideal_speedup,
                   "prefill_speedup": res.speed.get("prefill_speedup"), "cached": hit,
                   **{k: v for k, v in res.to_dict().items() if k != "chosen"}})
    else:
        for c in res.candidates:
            print(f"{c['phase']:>10} k={c['k']:>2} layers {c['set']:<24} "
                  f"ΔNLL {_ci(c, 'continuation_nll_delta')} top-1 {_ci(c, 'next_token_top1')} "
                  f"{'meets' if c['meets'] else 'misses'}")
    if not res.met:
        print(f"error: {res.note}", file=sys.stderr)
        return 1
    if not args.json:
        print(res.note)
    return 0


def _ci(c: dict, key: str) -> str:
    v, ci = c.get(key), c.get(f"{key}_ci")
    if v is None:
        return "—"
    return f"{v:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{v:+.3f}"
