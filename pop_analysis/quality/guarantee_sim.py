"""Does the certificate hold? Both procedures replayed on random splits of a pool of per-item
losses (items x nested candidate sets, smallest first), measured against the pool's own rates.

Per split: a selection split and a certification split are drawn from the pool without
replacement; the rest of the pool is left over.
- certified: the selection split fixes the sequence (the candidates up to and including the first
  whose selection rate exceeds α); the certification split tests it in order (fixed-sequence testing,
  exact binomial p-values at δ); the last set that passes is certified (none: nothing is);
- same items (today's choose): on the union of both splits, the largest candidate whose exact
  upper bound meets α, reported on the items that chose it.
A split violates when the chosen set's rate exceeds α. The pool is the population the splits
are drawn from, so its rate is the true rate (sampling without replacement only makes the
binomial bound more conservative); the rest-of-pool rate is reported beside it. The violation
rate carries its Monte-Carlo error over splits (binomial, and a Clopper-Pearson 95% interval).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

from pop_analysis.quality.guarantee import check_level


@dataclass(frozen=True)
class SimResult:
    """Violation rates of the certified and the same-items procedure over random splits."""

    alpha: float
    delta: float
    n_pool: int
    n_sel: int
    n_cert: int
    n_splits: int
    pool_rates: list  # per candidate: the pool's bad-item rate (the truth)
    certified: list  # per split: the certified index (-1: none)
    same_items: list  # per split: the same-items procedure's index (-1: none)
    violations: dict  # procedure -> {"rate", "mc_se", "ci", "rest_rate"}
    chosen_share: dict  # procedure -> share of splits where a set was chosen

    def mc_margin(self) -> float:
        """The Monte-Carlo error of a violation rate at δ over these splits (1.96 standard
        errors): a valid procedure stays under δ plus this."""
        return 1.96 * math.sqrt(self.delta * (1 - self.delta) / self.n_splits)


def _ucb(k: np.ndarray, n: int, delta: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bounds of k bad items out of n, elementwise."""
    return np.where(k >= n, 1.0, st.beta.ppf(1 - delta, k + 1, np.maximum(n - k, 1)))


def _certify(bad_sel, bad_cert, alpha, delta) -> int:
    sel_rate = bad_sel.mean(0)  # (m,)
    over = np.flatnonzero(sel_rate > alpha)
    m = (over[0] + 1) if len(over) else len(sel_rate)
    p = st.binom.cdf(bad_cert[:, :m].sum(0), len(bad_cert), alpha)  # (m,)
    fails = np.flatnonzero(p > delta)
    return (fails[0] if len(fails) else m) - 1


def _same_items(bad, alpha, delta) -> int:
    ok = np.flatnonzero(_ucb(bad.sum(0), len(bad), delta) <= alpha)
    return int(ok[-1]) if len(ok) else -1


def simulate(bad, alpha: float, delta: float, n_sel: int, n_cert: int, n_splits: int = 500,
             seed: int = 0) -> SimResult:
    """Replay both procedures on n_splits random splits of `bad` ((N, m) in {0, 1}: item x
    candidate, candidates nested smallest first)."""
    alpha, delta = check_level("alpha", alpha), check_level("delta", delta)
    bad = np.asarray(bad, dtype=float)  # (N, m)
    N = len(bad)
    if n_sel < 1 or n_cert < 1 or n_sel + n_cert >= N:
        raise ValueError(f"the splits ({n_sel} + {n_cert} items) must leave items of the "
                         f"{N}-item pool over")
    pool = bad.mean(0)  # (m,)
    rng = np.random.default_rng(seed)
    cert, same, rest = [], [], {"certified": [], "same_items": []}
    for _ in range(n_splits):
        perm = rng.permutation(N)
        sel, cer, left = perm[:n_sel], perm[n_sel:n_sel + n_cert], perm[n_sel + n_cert:]
        c = _certify(bad[sel], bad[cer], alpha, delta)
        s = _same_items(bad[perm[:n_sel + n_cert]], alpha, delta)
        cert.append(int(c))
        same.append(int(s))
        for name, i in (("certified", c), ("same_items", s)):
            rest[name].append(i >= 0 and bad[left, i].mean() > alpha)
    viol = {name: _violations(idx, pool, alpha, rest[name])
            for name, idx in (("certified", cert), ("same_items", same))}
    share = {name: float(np.mean(np.asarray(idx) >= 0))
             for name, idx in (("certified", cert), ("same_items", same))}
    return SimResult(alpha, delta, N, n_sel, n_cert, n_splits, pool.tolist(), cert, same, viol,
                     share)


def _violations(idx, pool, alpha, rest) -> dict:
    v = np.array([i >= 0 and pool[i] > alpha for i in idx], dtype=float)
    k, n = int(v.sum()), len(v)
    ci = st.binomtest(k, n).proportion_ci(0.95, method="exact")
    return {"rate": k / n, "mc_se": math.sqrt(max(k / n * (1 - k / n), 1e-12) / n),
            "ci": [float(ci.low), float(ci.high)], "rest_rate": float(np.mean(rest))}
