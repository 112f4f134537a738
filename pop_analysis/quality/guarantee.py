"""Finite-sample risk bounds and fixed-sequence testing (the certified choice's statistics).

The risk of a skip set is the rate of bad items (an item is bad when its paired ΔNLL exceeds
ε, or when POP's greedy continuation departs from the full model's early): a loss in {0, 1}, so
an exact binomial bound holds at any n, without asymptotics. For the hypothesis "the rate
exceeds α" the p-value is P(Bin(n, α) <= k) for k bad items of n; the one-sided Clopper-Pearson
upper bound at confidence 1 - δ is <= α exactly when that p-value is <= δ. For losses in [0, 1]
that are not binary, the Hoeffding-Bentkus p-value (the smaller of Hoeffding's and Bentkus's
bounds on the same tail probability, so still valid) replaces it. On binary losses the exact
binomial tail is always the tighter one: Bentkus's bound is e times a binomial tail.

Fixed-sequence testing (Learn-then-Test, arXiv 2110.01052): hypotheses ordered before the data
are seen are tested in order at level δ each, stopping at the first that is not rejected; the
family-wise error stays <= δ without a correction. SciPy does the distributions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
from scipy import optimize, stats as st


class GuaranteeError(ValueError):
    """A bound that cannot be computed as asked (levels outside (0, 1), no items)."""


@dataclass(frozen=True)
class RiskBound:
    """An observed bad-item rate, its upper bound at 1 - δ, and the p-value against α."""

    n: int  # items
    bad: float  # bad items (the summed loss when it is not binary)
    rate: float  # observed rate (mean loss)
    upper: float  # upper bound at confidence 1 - delta
    p_value: float  # of "the rate exceeds alpha"
    method: str  # "clopper-pearson" or "hoeffding-bentkus"

    def passes(self, delta: float) -> bool:
        return self.p_value <= delta


def check_level(name: str, x: float) -> float:
    if not isinstance(x, (int, float)) or not 0 < x < 1 or math.isnan(x):
        raise GuaranteeError(f"{name} must lie in (0, 1), got {x!r}")
    return float(x)


def _losses(losses) -> np.ndarray:
    x = np.asarray(losses, dtype=float)
    if x.ndim != 1 or len(x) == 0:
        raise GuaranteeError("a risk bound needs at least one item")
    if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > 1:
        raise GuaranteeError("losses must be numbers in [0, 1]")
    return x


def binomial_p(k: int, n: int, alpha: float) -> float:
    """P(Bin(n, alpha) <= k): the exact p-value of 'the bad-item rate exceeds alpha'."""
    return float(st.binom.cdf(k, n, alpha))


def clopper_pearson_upper(k: int, n: int, delta: float) -> float:
    """The one-sided exact upper bound of a binomial rate at confidence 1 - delta."""
    return 1.0 if k >= n else float(st.beta.ppf(1 - delta, k + 1, n - k))


def _kl_bernoulli(a: float, b: float) -> float:
    a = min(max(a, 1e-300), 1 - 1e-16)
    return a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))


def hoeffding_bentkus_p(mean: float, n: int, alpha: float) -> float:
    """The Hoeffding-Bentkus p-value of 'the mean loss in [0, 1] exceeds alpha'."""
    hoeffding = math.exp(-n * _kl_bernoulli(min(mean, alpha), alpha))
    bentkus = math.e * float(st.binom.cdf(math.ceil(n * mean), n, alpha))
    return min(1.0, hoeffding, bentkus)


def hoeffding_bentkus_upper(mean: float, n: int, delta: float) -> float:
    """The smallest alpha whose Hoeffding-Bentkus p-value is <= delta (the upper bound)."""
    f = lambda a: hoeffding_bentkus_p(mean, n, a) - delta  # noqa: E731 - falls as a grows
    if f(1 - 1e-12) > 0:
        return 1.0
    return float(optimize.brentq(f, max(mean, 1e-12), 1 - 1e-12, xtol=1e-10))


def risk_bound(losses, alpha: float, delta: float) -> RiskBound:
    """The bound of one set's losses: exact binomial for {0, 1} losses, Hoeffding-Bentkus for
    other losses in [0, 1]."""
    alpha, delta = check_level("alpha", alpha), check_level("delta", delta)
    x = _losses(losses)
    n, total = len(x), float(x.sum())
    if np.all((x == 0) | (x == 1)):
        k = int(total)
        return RiskBound(n, k, k / n, clopper_pearson_upper(k, n, delta), binomial_p(k, n, alpha),
                         "clopper-pearson")
    mean = total / n
    return RiskBound(n, total, mean, hoeffding_bentkus_upper(mean, n, delta),
                     hoeffding_bentkus_p(mean, n, alpha), "hoeffding-bentkus")


def bad_items(delta_nll, epsilon: float) -> np.ndarray:
    """1.0 for each item whose paired ΔNLL exceeds epsilon (nats per token), else 0.0."""
    d = np.asarray(delta_nll, dtype=float)
    if not np.all(np.isfinite(d)):
        raise GuaranteeError("a per-item ΔNLL is missing or not finite")
    return (d > epsilon).astype(float)


def fixed_sequence(tests: Iterable[Callable[[], RiskBound]], delta: float):
    """Test in order, lazily: each test is called only while every earlier one passed.
    (index of the last passing test or -1, the bounds computed)."""
    delta = check_level("delta", delta)
    last, done = -1, []
    for i, test in enumerate(tests):
        bound = test()
        done.append(bound)
        if not bound.passes(delta):
            break
        last = i
    return last, done
