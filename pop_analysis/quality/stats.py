"""95% intervals for quality numbers, from scipy.stats: means, proportions, paired differences.

Every estimate carries n. A mean gets Student's t interval; a proportion the exact
(Clopper-Pearson) interval. A variant's difference from the full model is paired over items: a
BCa bootstrap of the per-item differences for continuous metrics; for accuracies McNemar's exact
test (a binomial test on the discordant pairs) with an exact, conservative interval for the
difference. Fewer than 2 items give no interval: `StatsError` says so.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

CONFIDENCE = 0.95
RESAMPLES = 9999  # bootstrap resamples (scipy's default)
NO_CHANGE = "no measurable change"


class StatsError(ValueError):
    """An interval that cannot be computed (too few items, unequal pairs)."""


@dataclass(frozen=True)
class Estimate:
    """A number with its sample size and 95% interval."""

    n: int  # items behind the number
    value: float  # the mean, proportion or mean difference
    ci: tuple[float, float]  # 95% interval
    method: str  # "t", "clopper-pearson", "bootstrap-bca", "mcnemar-exact"
    p_value: float | None = None  # McNemar's exact test of no difference (accuracy deltas)

    @property
    def width(self) -> float:
        return self.ci[1] - self.ci[0]

    def includes(self, x: float = 0.0) -> bool:
        return self.ci[0] <= x <= self.ci[1]


def check_n(n: int) -> None:
    if n < 2:
        raise StatsError(f"a 95% interval needs at least 2 items, got n = {n}")


def _array(values) -> np.ndarray:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return x[np.isfinite(x)]


def mean_ci(values, confidence: float = CONFIDENCE, bounds=(-math.inf, math.inf)) -> Estimate:
    """Mean of per-item values (None / NaN dropped) with Student's t interval, clipped to the
    values' possible range `bounds` (a mean of fractions stays in [0, 1])."""
    x = _array(values)
    check_n(len(x))
    m, sem = float(x.mean()), float(st.sem(x))
    if sem == 0:
        return Estimate(len(x), m, (m, m), "t")
    lo, hi = st.t.interval(confidence, len(x) - 1, loc=m, scale=sem)
    return Estimate(len(x), m, (max(float(lo), bounds[0]), min(float(hi), bounds[1])), "t")


def proportion_ci(hits, confidence: float = CONFIDENCE) -> Estimate:
    """Fraction of true items with the exact binomial (Clopper-Pearson) interval."""
    x = _array(hits).astype(bool)
    check_n(len(x))
    k, n = int(x.sum()), len(x)
    ci = st.binomtest(k, n).proportion_ci(confidence, method="exact")
    return Estimate(n, k / n, (float(ci.low), float(ci.high)), "clopper-pearson")


def _pairs(variant, full) -> tuple[np.ndarray, np.ndarray]:
    v, f = list(variant), list(full)
    if len(v) != len(f):
        raise StatsError(f"paired values need equal lengths, got {len(v)} and {len(f)}")
    keep = [i for i, (a, b) in enumerate(zip(v, f))
            if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    check_n(len(keep))
    return np.asarray([v[i] for i in keep], float), np.asarray([f[i] for i in keep], float)


def paired_delta(variant, full, confidence: float = CONFIDENCE, seed: int = 0) -> Estimate:
    """Mean of variant - full over items (pairs with a missing side dropped), with a BCa
    bootstrap interval over items (seeded: the same data give the same interval)."""
    v, f = _pairs(variant, full)
    d = v - f
    m = float(d.mean())
    if np.ptp(d) == 0:
        return Estimate(len(d), m, (m, m), "bootstrap-bca")
    for method in ("BCa", "percentile"):  # BCa fails on near-degenerate data: fall back
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = st.bootstrap((d,), np.mean, confidence_level=confidence, n_resamples=RESAMPLES,
                               method=method, rng=np.random.default_rng(seed))
        lo, hi = res.confidence_interval
        if math.isfinite(lo) and math.isfinite(hi):
            return Estimate(len(d), m, (float(lo), float(hi)), f"bootstrap-{method.lower()}")
    raise StatsError("the bootstrap gave no finite interval")  # pragma: no cover - not seen


def paired_accuracy_delta(variant, full, confidence: float = CONFIDENCE) -> Estimate:
    """Accuracy of variant - full over the same items, McNemar's exact p-value and an interval.

    With b items only the variant gets right and c only the full model gets right, the
    difference is (b - c) / n = r (2 pi - 1), r = (b + c) / n the discordant rate and
    pi = b / (b + c). Exact intervals for r and pi at half the error rate each (Bonferroni)
    bound it: conservative, and an interval that excludes 0 implies McNemar's p < 0.05.
    """
    v, f = (x.astype(bool) for x in _pairs(variant, full))
    n, b, c = len(v), int((v & ~f).sum()), int((~v & f).sum())
    level = 1 - (1 - confidence) / 2
    r = st.binomtest(b + c, n).proportion_ci(level, method="exact")
    if b + c:
        pi = st.binomtest(b, b + c).proportion_ci(level, method="exact")
        p_lo, p_hi, p_value = pi.low, pi.high, float(st.binomtest(b, b + c, 0.5).pvalue)
    else:
        p_lo, p_hi, p_value = 0.0, 1.0, 1.0
    lo = (2 * p_lo - 1) * (r.high if p_lo < 0.5 else r.low)
    hi = (2 * p_hi - 1) * (r.high if p_hi > 0.5 else r.low)
    return Estimate(n, (b - c) / n, (float(lo), float(hi)), "mcnemar-exact", p_value)


def verdict(delta: Estimate, higher_is_better: bool = True) -> str:
    """'better', 'worse' or 'no measurable change' (the interval includes 0)."""
    if delta.includes(0.0):
        return NO_CHANGE
    return "better" if (delta.value > 0) == higher_is_better else "worse"


def required_n(sd: float, width: float, confidence: float = CONFIDENCE) -> int:
    """Smallest n whose t interval of a mean with per-item spread `sd` is narrower than `width`."""
    if sd <= 0:
        return 2
    if width <= 0:
        raise StatsError(f"the target width must be positive, got {width}")
    n = 2
    while 2 * st.t.ppf(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n) >= width:
        n += 1
    return n


def mean_halfwidths(stds, n: int) -> list[float] | None:
    """Half-widths of the 95% Student t interval of means over n samples, from the samples'
    standard deviations divided by n (as a calibration stores them); None below 2 samples."""
    if n < 2 or stds is None:
        return None
    q = float(st.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) / math.sqrt(n - 1)  # s_n / sqrt(n-1) = SE
    return [q * float(s) for s in stds]
