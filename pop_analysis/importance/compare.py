"""Rank agreement between importance methods: Kendall's tau-b and Spearman's rho of their
per-layer means, with 95% percentile-bootstrap intervals over prompts (scipy.stats.bootstrap).

Every measured series has per-prompt values (n, L) on the same n prompts, so one resample of the
prompts resamples every method at once (a paired bootstrap); a baseline without per-prompt values
keeps its ranking. The bootstrap statistic is vectorised: tau-b is the normalised dot product of
the layer-pair signs (sum sa·sb / sqrt(sum sa² · sum sb²)), rho the Pearson correlation of the
average ranks (scipy.stats.rankdata); the point values equal scipy's kendalltau and spearmanr
(tests compare them). A constant series has no ranking: its agreements are None.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

RESAMPLES = 999
CONFIDENCE = 0.95


@dataclass
class Agreement:
    """Pairwise rank agreement of named series (row/column order = names)."""

    names: list[str]
    n: int  # prompts behind the measured series
    kendall: list[list[float | None]]
    spearman: list[list[float | None]]
    kendall_ci: list[list[list[float] | None]]  # [low, high] per pair
    spearman_ci: list[list[list[float] | None]]
    resamples: int = RESAMPLES


def kendall_tau_b(values: np.ndarray) -> np.ndarray:
    """tau-b between every pair of rows of values (..., M, L): (..., M, M), NaN where a row is
    constant."""
    i, j = np.triu_indices(values.shape[-1], k=1)
    s = np.sign(values[..., i] - values[..., j])  # (..., M, P) signs of every layer pair
    dot = s @ np.swapaxes(s, -1, -2)  # (..., M, M)
    norm = np.sqrt(np.einsum("...mp,...mp->...m", s, s))  # (..., M)
    with np.errstate(invalid="ignore", divide="ignore"):
        return dot / (norm[..., :, None] * norm[..., None, :])


def spearman_rho(values: np.ndarray) -> np.ndarray:
    """Spearman's rho between every pair of rows of values (..., M, L): (..., M, M)."""
    r = st.rankdata(values, axis=-1)  # (..., M, L) average ranks
    r = r - r.mean(-1, keepdims=True)
    norm = np.sqrt((r * r).sum(-1))  # (..., M)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (r @ np.swapaxes(r, -1, -2)) / (norm[..., :, None] * norm[..., None, :])


def _means(samples: list[np.ndarray | None], fixed: list[np.ndarray], idx: np.ndarray) -> np.ndarray:
    """Per-layer means of every series over resampled prompts idx (R, n): (R, M, L)."""
    R, n = idx.shape
    counts = np.zeros((R, n))  # (R, n) times each prompt was drawn
    np.add.at(counts, (np.arange(R)[:, None], idx), 1.0)
    rows = [counts @ s / n if s is not None else np.broadcast_to(f, (R, f.shape[0]))
            for s, f in zip(samples, fixed)]  # M x (R, L)
    return np.stack(rows, axis=1)  # (R, M, L)


def agreement(means: dict[str, list[float]], samples: dict[str, np.ndarray] | None = None,
              resamples: int = RESAMPLES, seed: int = 0) -> Agreement:
    """Kendall and Spearman between every pair of series, intervals over the prompts."""
    names = list(means)
    samples = samples or {}
    ns = {np.asarray(samples[k]).shape[0] for k in names if k in samples}
    if len(ns) > 1:
        raise ValueError(f"series measured on different numbers of prompts: {sorted(ns)}")
    n = ns.pop() if ns else 0
    point = np.stack([np.asarray(means[k], dtype=float) for k in names])  # (M, L)
    tau, rho = kendall_tau_b(point), spearman_rho(point)
    lo_hi = _intervals(names, samples, point, n, resamples, seed)
    return Agreement(names, n, _cells(tau), _cells(rho), *lo_hi, resamples=resamples)


def _intervals(names, samples, point, n, resamples, seed):
    """(kendall_ci, spearman_ci) as nested lists; None everywhere without prompts to resample."""
    M = len(names)
    if n < 2 or resamples < 1:
        return [[None] * M for _ in range(M)], [[None] * M for _ in range(M)]
    mats = [np.asarray(samples[k], dtype=float) if k in samples else None for k in names]

    def statistic(idx, axis=-1):
        """Resampled prompt indices (R, n) -> every pair's tau and rho, (2*M*M, R)."""
        idx = np.atleast_2d(np.moveaxis(np.asarray(idx, dtype=int), axis, -1))  # (R, n)
        v = _means(mats, list(point), idx)  # (R, M, L)
        both = np.stack([kendall_tau_b(v), spearman_rho(v)])  # (2, R, M, M)
        return np.moveaxis(both, 1, -1).reshape(2 * M * M, -1)  # (2*M*M, R)

    with warnings.catch_warnings():  # a constant series gives NaN resamples: its cells are None
        warnings.simplefilter("ignore")
        res = st.bootstrap((np.arange(n),), statistic, n_resamples=resamples, vectorized=True,
                           confidence_level=CONFIDENCE, method="percentile",
                           rng=np.random.default_rng(seed), batch=100)
    lo = res.confidence_interval.low.reshape(2, M, M)
    hi = res.confidence_interval.high.reshape(2, M, M)
    return ([[_pair(lo[t, a, b], hi[t, a, b]) for b in range(M)] for a in range(M)]
            for t in (0, 1))


def _pair(lo: float, hi: float) -> list[float] | None:
    return [float(lo), float(hi)] if np.isfinite(lo) and np.isfinite(hi) else None


def _cells(mat: np.ndarray) -> list[list[float | None]]:
    return [[float(x) if np.isfinite(x) else None for x in row] for row in mat]


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman rank correlation (scipy; average ranks for ties); None when either side is
    constant."""
    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(st.spearmanr(a, b)[0])
