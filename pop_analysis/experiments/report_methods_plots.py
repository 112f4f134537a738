"""PNG plots of the methods part (matplotlib): every method's curve normalised, the agreement and
angular-distance heatmaps, and quality against k as one frontier per method, tail always drawn.
Layer ids are 0-indexed on every axis; error bars are 95% intervals."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pop_analysis.experiments.report_plots import _bars, _plt
from pop_analysis.importance.methods import METHODS, primary


def normalised(values) -> list[float]:
    """Min-max to [0, 1] (a constant series is all 0): curves of different units on one axis."""
    v = np.asarray(values, dtype=float)
    span = v.max() - v.min()
    return ((v - v.min()) / span if span > 0 else np.zeros_like(v)).tolist()


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(imp: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for m in imp["methods"]:
        key = primary(m)
        ax.plot(range(imp["n_layers"]), normalised(imp["series"][key]), "o-", ms=3,
                lw=2.5 if m in ("dropone", "gate") else 1.2, label=f"{METHODS[m].title} ({key})")
    ax.set_xlabel("layer (0-indexed)")
    ax.set_ylabel("importance, min-max normalised")
    ax.set_title("Every method's per-layer importance (larger = more important)")
    ax.legend(fontsize=7, ncol=3)
    _save(plt, fig, path)


def plot_agreement(imp: dict, path: Path) -> None:
    plt = _plt()
    a = imp["agreement"]
    names = a["names"]
    tau = np.array([[np.nan if x is None else x for x in row] for row in a["kendall"]])
    fig, ax = plt.subplots(figsize=(0.5 * len(names) + 3, 0.5 * len(names) + 2))
    im = ax.imshow(tau, vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for i in range(len(names)):
        for j in range(len(names)):
            if np.isfinite(tau[i, j]):
                ax.text(j, i, f"{tau[i, j]:.2f}", ha="center", va="center", fontsize=5)
    fig.colorbar(im, ax=ax, label="Kendall τ")
    ax.set_title(f"Rank agreement over layers (n = {a['n']} prompts)")
    _save(plt, fig, path)


def plot_triangle(imp: dict, path: Path) -> None:
    plt = _plt()
    L = imp["n_layers"]
    grid = np.full((L, L), np.nan)
    for l, row in enumerate(imp["triangle"]):
        grid[l, :len(row)] = [np.nan if x is None else x for x in row]
    fig, ax = plt.subplots(figsize=(7, 5.5))
    im = ax.imshow(grid, cmap="viridis", origin="lower", aspect="auto")
    ax.set_xticks(range(0, L, max(1, L // 10)), [str(n + 1) for n in range(0, L, max(1, L // 10))])
    ax.set_xlabel("span n (blocks)")
    ax.set_ylabel("first block l (0-indexed)")
    fig.colorbar(im, ax=ax, label="arccos(cos(h_l, h_l+n)) / π")
    ax.set_title("Angular distance on the last prompt token (Gromov et al.)")
    _save(plt, fig, path)


def plot_frontier(cmp: dict, path: Path) -> None:
    plt = _plt()
    shapes = cmp["config"]["shapes"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 4.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = [r for r in cmp["rows"] if r["shape"] == shape]
        for m in dict.fromkeys(r["method"] for r in rows):
            mine = sorted((r for r in rows if r["method"] == m), key=lambda r: r["k"])
            if m == "random":
                ks = sorted({r["k"] for r in mine})
                lo = [min(r["continuation_nll_delta"] for r in mine if r["k"] == k) for k in ks]
                hi = [max(r["continuation_nll_delta"] for r in mine if r["k"] == k) for k in ks]
                ax.fill_between(ks, lo, hi, color="grey", alpha=0.2, label="random (range of draws)")
                continue
            xs = [r["k"] for r in mine]
            ys = [r["continuation_nll_delta"] for r in mine]
            err = np.hstack([_bars(y, r.get("continuation_nll_delta_ci")) or [[0], [0]]
                             for y, r in zip(ys, mine)])
            tail = m == "tail"
            ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, lw=2.5 if tail else 1.2,
                        color="black" if tail else None, label=METHODS[m].title)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_yscale("symlog", linthresh=0.05)
        ax.set_xlabel("layers skipped in prefill (k)")
        ax.set_ylabel("ΔNLL vs full (nats/token)")
        ax.set_title(f"{shape} sets: quality against k (n = {cmp['n']})")
        ax.legend(fontsize=7)
    _save(plt, fig, path)
