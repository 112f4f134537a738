"""The healing options of a command (--heal, --heal-budget, --heal-chunk), checked by the one
validator of pop_vllm.healing before any model work."""
from __future__ import annotations

from pop_analysis.commands._common import Num
from pop_vllm.healing import DEFAULT_CHUNK, MAX_CHUNK, NO_HEAL, POLICIES, Heal, make, parse_budget


def add_heal_args(p) -> None:
    p.add_argument("--heal", choices=POLICIES, default="none",
                   help="heal the pruned prompt's cache after the first token: eager (all at "
                        "once) or budget (--heal-budget per decode step); none is plain POP")
    p.add_argument("--heal-budget", metavar="N|Xms",
                   help="with --heal budget: positions (16) or milliseconds (5ms) per decode step")
    p.add_argument("--heal-chunk", type=Num(int, 1, MAX_CHUNK), default=DEFAULT_CHUNK,
                   help=f"positions per healing chunk (default {DEFAULT_CHUNK})")


def heal_from_args(args) -> Heal:
    budget = parse_budget(args.heal_budget) if args.heal_budget is not None else {}
    if args.heal == "none" and not budget and args.heal_chunk == DEFAULT_CHUNK:
        return NO_HEAL
    return make(args.heal, args.heal_chunk, **budget)
