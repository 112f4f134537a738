"""A skip set certified on items it never chose on: at most alpha of items lose more than epsilon,
with confidence 1 - delta (three disjoint splits; prints the certificate as JSON)."""
from __future__ import annotations

import sys

from pop_analysis.commands._common import COUNT, MAX_COUNT, MAX_TOKENS, Num, add_model_args, \
    emit_json, load, quiet_hf
from pop_analysis.commands._importance import add_ranking_args, ranking, ranking_config
from pop_analysis.experiments.certify import LOSSES, CertifyConfig, cached_certify
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES
from pop_analysis.progress import terminal_bar
from pop_analysis.quality.splits import make_splits

LEVEL = Num(float, 0.0, 1.0)  # open interval checked by CertifyConfig


def add_arguments(p) -> None:
    add_model_args(p)
    d = CertifyConfig()
    p.add_argument("--alpha", type=LEVEL, default=d.alpha,
                   help="the largest share of bad items certified (e.g. 0.1)")
    p.add_argument("--epsilon", type=Num(float, 0.0, 1e6), default=d.epsilon,
                   help="an item is bad when its paired ΔNLL exceeds this (nats per token)")
    p.add_argument("--delta", type=LEVEL, default=d.delta,
                   help="the certificate is wrong with probability at most this")
    p.add_argument("--loss", choices=LOSSES, default=d.loss,
                   help="nll: ΔNLL > epsilon; divergence: POP's greedy output departs from the "
                        "full model's within --tokens tokens")
    p.add_argument("--tokens", type=Num(int, 1, 4096), default=d.tokens,
                   help="greedy tokens compared by the divergence loss")
    p.add_argument("--method", default=d.method, help=f"whose ranking: {', '.join(METHODS)}")
    p.add_argument("--shape", default=d.shape, choices=SHAPES,
                   help="free: any layers; block: one contiguous block")
    p.add_argument("--refine", type=Num(int, 1, 64), default=d.refine,
                   help="candidates per search step on the selection items (1: the ranking's own "
                        "order, measured --chunk sets at a time; more: a greedy step each)")
    p.add_argument("--chunk", type=Num(int, 1, 64), default=d.chunk,
                   help="sets evaluated together on the certification items")
    p.add_argument("--max-sets", type=Num(int, 0, 10_000), default=d.max_sets,
                   help="the longest sequence searched (0: up to every layer but one)")
    add_ranking_args(p)
    p.add_argument("--selection-dataset", default="gsm8k", help="items the search runs on")
    p.add_argument("--selection-offset", type=Num(int, 0, MAX_COUNT), default=0)
    p.add_argument("--selection-samples", type=COUNT, default=100)
    p.add_argument("--cert-dataset", default=None,
                   help="items the sequence is certified on (default: the selection's set)")
    p.add_argument("--cert-offset", type=Num(int, 0, MAX_COUNT), default=None,
                   help="default: right after the selection items when the set is the same")
    p.add_argument("--cert-samples", type=COUNT, default=300)
    p.add_argument("--answer-tokens", type=Num(int, 0, MAX_TOKENS), default=d.answer_tokens,
                   help="reference tokens scored per item (0: the whole reference)")


def splits_from_args(args):
    """The three splits, checked disjoint before any model loads."""
    cert_set = args.cert_dataset or args.selection_dataset
    offset = args.cert_offset
    if offset is None:
        offset = args.selection_offset + args.selection_samples \
            if cert_set == args.selection_dataset else 0
    return make_splits((args.dataset, args.samples),
                       (args.selection_dataset, args.selection_offset, args.selection_samples),
                       (cert_set, offset, args.cert_samples), field=args.field)


def run(args) -> int:
    quiet_hf()
    cfg = CertifyConfig(alpha=args.alpha, epsilon=args.epsilon, delta=args.delta, loss=args.loss,
                        tokens=args.tokens, method=args.method, shape=args.shape,
                        refine=args.refine, answer_tokens=args.answer_tokens, chunk=args.chunk,
                        max_sets=args.max_sets)
    splits = splits_from_args(args)  # overlapping splits fail here, before loading
    rcfg = ranking_config(args, [args.method])
    lm = load(args)
    bar = None if args.quiet else terminal_bar
    importance, _ = ranking(args, lm, rcfg, bar)
    res, hit = cached_certify(lm, importance, splits, cfg, not args.no_cache, bar)
    emit_json({"cached": hit, **res.to_dict()})
    if not res.met:
        print(f"error: {res.note}", file=sys.stderr)
        return 1
    print(res.note, file=sys.stderr)
    return 0
