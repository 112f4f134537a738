"""Skip sets from a ranking, for a budget of k layers: one contiguous block or a free set; and the
zero-cost baselines (tail, seeded random) as scores oriented like every other method's.

Ranking convention of the whole project: larger score = more important, so a budget of k skips
the k lowest (ties: the deeper layer first, as POP prunes deep layers).
"""
from __future__ import annotations

import numpy as np

from pop_analysis.errors import InputError
from pop_analysis.importance.suggest import lowest, lowest_block

SHAPES = ("block", "free")  # one contiguous block / any k layers
BUDGETS = (0.2, 0.25, 0.33, 0.4, 0.5)  # shares of the layers the comparison skips


class BudgetError(InputError):
    """A skip budget that no model can take (k out of range, an unknown shape)."""


def budget_k(n_layers: int, fraction: float) -> int:
    """round(fraction * L) layers; at least 1 and at most L - 1 (one layer must run)."""
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise BudgetError(f"a skip budget is a share of the layers in (0, 1), got {fraction!r}")
    return check_k(max(1, round(fraction * n_layers)), n_layers)


def check_k(k: int, n_layers: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n_layers - 1:
        raise BudgetError(f"k = {k!r} layers is out of range: a {n_layers}-layer model can skip "
                          f"1..{n_layers - 1}")
    return k


def pick(scores, k: int, shape: str) -> tuple[int, ...]:
    """The k least important layers of `scores` as a free set or the contiguous block of k with
    the lowest summed score."""
    if shape not in SHAPES:
        raise BudgetError(f"unknown skip-set shape {shape!r}; choose from {', '.join(SHAPES)}")
    scores = [float(x) for x in scores]
    check_k(k, len(scores))
    return tuple(lowest(scores, k) if shape == "free" else lowest_block(scores, k))


def tail_scores(n_layers: int) -> list[float]:
    """The tail baseline as scores: layer l scores (L - l) / L, so the k lowest are the last k."""
    return [(n_layers - i) / n_layers for i in range(n_layers)]


def random_scores(n_layers: int, seed: int) -> list[float]:
    """Seeded uniform scores: the random baseline's ranking for one seed."""
    return np.random.default_rng(seed).random(n_layers).tolist()


def random_pick(n_layers: int, k: int, shape: str, seed: int) -> tuple[int, ...]:
    """A seeded random set of k layers: k of L for a free set, a block at a random start."""
    check_k(k, n_layers)
    if shape == "block":
        start = int(np.random.default_rng(seed).integers(0, n_layers - k + 1))
        return tuple(range(start, start + k))
    return pick(random_scores(n_layers, seed), k, shape)


def jaccard(a, b) -> float | None:
    """|a ∩ b| / |a ∪ b| of two skip sets (None when both are empty)."""
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else None
