"""Rank layers with every importance method on the same prompts, side by side (and compare the
skip sets each method picks, per budget)."""
from __future__ import annotations

import sys

from pop_analysis.commands._common import (
    RATIO_OPEN,
    Num,
    NumList,
    add_model_args,
    emit_json,
    load,
    quiet_hf,
)
from pop_analysis.commands._importance import (
    add_eval_args,
    add_ranking_args,
    ranking,
    ranking_config,
)
from pop_analysis.experiments.methods_compare import CompareConfig, cached_comparison
from pop_analysis.importance.methods import METHODS, help_text, parse_methods, primary
from pop_analysis.importance.picks import BUDGETS, SHAPES
from pop_analysis.progress import terminal_bar


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--methods", default="all",
                   help=f"comma list of {', '.join(METHODS)}, or all. {help_text()}")
    add_ranking_args(p)
    p.add_argument("--compare", action="store_true",
                   help="also run POP with each method's skip set per budget on held-out items")
    p.add_argument("--budgets", type=NumList(RATIO_OPEN), default=",".join(map(str, BUDGETS)),
                   help="shares of the layers skipped in the comparison")
    p.add_argument("--shapes", default=",".join(SHAPES), help="block (contiguous), free, or both")
    p.add_argument("--random-seeds", type=Num(int, 1, 1000), default=3, help="draws of the random baseline")
    p.add_argument("--retrieval", type=Num(int, 0, 100_000), default=0,
                   help="synthetic retrieval items scored too in the comparison (0: none)")
    add_eval_args(p, samples=100)


def compare_config(args) -> CompareConfig:
    shapes = tuple(s.strip() for s in args.shapes.split(",") if s.strip())
    return CompareConfig(budgets=tuple(args.budgets), shapes=shapes,
                         dataset=args.eval_dataset, n_samples=args.eval_samples,
                         offset=args.offset, answer_tokens=args.answer_tokens,
                         random_seeds=args.random_seeds, speed=not args.no_speed,
                         bench_tokens=args.bench_tokens, retrieval_n=args.retrieval)


def run(args) -> int:
    quiet_hf()
    cfg = ranking_config(args, parse_methods(args.methods))  # bad input fails before loading
    ccfg = compare_config(args) if args.compare else None
    lm = load(args)
    bar = None if args.quiet or args.json else terminal_bar
    res, hit = ranking(args, lm, cfg, bar)
    out = as_json(res, hit)
    if ccfg is not None:
        cmp, chit = cached_comparison(lm, res, ccfg, not args.no_cache, bar)
        out["comparison"] = {"cached": chit, **cmp.to_dict()}
        for note in cmp.notes:
            print(f"note: {note}", file=sys.stderr)
    if args.json:
        emit_json(out)
    else:
        print(report(res, hit, out.get("comparison")))
    return 0


def as_json(res, hit: bool) -> dict:
    """One per-layer score list per method and series (larger = more important)."""
    scores: dict = {}
    for key, values in res.series.items():
        method, series = key.split(".", 1)
        scores.setdefault(method, {})[series] = values
    return {"model": res.model, "dataset": res.dataset, "n_samples": res.n_samples,
            "n_layers": res.n_layers, "methods": res.methods, "scores": scores,
            "primary": {m: primary(m) for m in res.methods}, "agreement": res.agreement,
            "triangle": res.triangle, "tokens": res.tokens, "seconds": res.seconds,
            "stored": res.stored, "cached": hit}


def report(res, hit: bool, comparison: dict | None) -> str:
    """Scores per layer (each method's primary series; --json has every series), agreement with
    drop-one (else the gate), verdicts."""
    src = "stored result" if hit else ", ".join(f"{p} {s:.1f} s" for p, s in res.seconds.items())
    keys = [primary(m) for m in res.methods]
    lines = [f"{res.model} on {res.dataset}: {res.n_samples} prompts ({src}); larger = more important",
             "layer " + " ".join(f"{k[:14]:>14}" for k in keys)]
    for i in range(res.n_layers):
        lines.append(f"{i:>5} " + " ".join(f"{res.series[k][i]:>14.4g}" for k in keys))
    a = res.agreement
    ref = next((k for k in ("dropone.nll", "gate.prefill") if k in a["names"]), None)
    if ref:
        r = a["names"].index(ref)
        for j, name in enumerate(a["names"]):
            tau, ci = a["kendall"][r][j], a["kendall_ci"][r][j]
            if name != ref and tau is not None:
                band = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
                lines.append(f"Kendall tau({ref}, {name}) = {tau:.2f}{band}")
    for v in (comparison or {}).get("verdicts", []):
        lines.append(v["line"])
    return "\n".join(lines)
