"""The --repair option shared by generate, drift, sweep and bench (the pop_repair variant)."""
from __future__ import annotations

from pop_analysis.progress import terminal_bar


def add_repair_arg(p) -> None:
    p.add_argument("--repair", default=None, metavar="KEY|auto",
                   help="K/V repair for the pop_repair variant: a stored key (repair list) or "
                        "auto (the newest stored for this model and skip set, else fit one on "
                        "the builtin prompts)")


def attach_repair(args, lm, skip, quiet: bool = False):
    """Load or fit the repair named by --repair and attach it for `skip`; None without one."""
    if not args.repair:
        return None
    from pop_analysis.repair.store import ensure

    return ensure(lm, skip, args.repair, None if quiet else terminal_bar)


def need_repair(args, variants) -> None:
    if "pop_repair" in variants and not args.repair:
        raise ValueError("the pop_repair variant needs --repair KEY or --repair auto")
