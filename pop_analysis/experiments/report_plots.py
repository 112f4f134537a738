"""PNG plots of the reproduced tables (matplotlib); error bars are 95% intervals."""
from __future__ import annotations

from pathlib import Path

from pop_analysis.experiments.paper import PAPER_TABLES


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _bars(value, ci):
    """Matplotlib's yerr (distances below and above) from a value and its interval."""
    return [[value - ci[0]], [ci[1] - value]] if ci else None


def _errorbar(ax, xs, rows, m, **kw):
    for x, r in zip(xs, rows):
        if r is not None and r.get(m) is not None:
            ax.errorbar([x], [r[m]], yerr=_bars(r[m], r.get(f"{m}_ci")), fmt="o", capsize=4, **kw)
            kw.pop("label", None)


def plot_table3(res: dict, ret: dict | None, path: Path) -> None:
    plt = _plt()
    rows = [r for r in res["rows"] if r["variant"] != "full"]
    names = [r["variant"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    ax = axes[0]
    for i, r in enumerate(rows):
        if r.get("continuation_nll_delta") is not None:
            d, ci = r["continuation_nll_delta"], r.get("continuation_nll_delta_ci")
            ax.errorbar([i], [d], yerr=_bars(d, ci), fmt="o", capsize=4, color="C0")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("ΔNLL vs full (nats/token)")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_title("GSM8K answers: NLL increase over the full model")
    ax = axes[1]
    if ret:
        rrows = {r["variant"]: r for r in ret["rows"]}
        order = ["full"] + names
        _errorbar(ax, range(len(order)), [rrows.get(v) for v in order], "retrieval_acc",
                  color="C1", label="variant")
        ax.set_xticks(range(len(order)), order, rotation=30, ha="right")
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("retrieval exact match")
        ax.set_title("Synthetic retrieval (95% exact intervals)")
    else:
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _speedups(ax, ratios, rows) -> None:
    """Measured medians with the rounds' spread as bars; a flagged result (noisy, busy machine,
    above its ideal) is drawn hollow and red, so it never reads as a plain measurement."""
    ys = [r.get("prefill_speedup") for r in rows]
    ax.plot(ratios, ys, "-", color="C0")
    for x, y, r in zip(ratios, ys, rows):
        if y is None:
            continue
        lo, hi = r.get("speedup_range") or (y, y)
        flagged = r.get("timing_trustworthy") is False
        ax.errorbar([x], [y], yerr=[[max(0.0, y - lo)], [max(0.0, hi - y)]], fmt="o", capsize=3,
                    color="C3" if flagged else "C0", mfc="none" if flagged else "C0")
    ax.plot([], [], "o-", color="C0", label="ours: measured (CPU), IQR of rounds")
    if any(r.get("timing_trustworthy") is False for r in rows):
        ax.plot([], [], "o", color="C3", mfc="none", label="ours: flagged (see the table)")


def plot_table4(res: dict, ret: dict | None, path: Path) -> None:
    plt = _plt()
    t4 = PAPER_TABLES["table4"]
    rows = res["rows"]
    ratios = [r["skip_ratio"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for x, r in zip(ratios, rows):
        if r.get("continuation_nll_delta") is not None:
            d = r["continuation_nll_delta"]
            ax.errorbar([x], [d], yerr=_bars(d, r.get("continuation_nll_delta_ci")), fmt="o",
                        capsize=4, color="C0")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("skip ratio")
    ax.set_ylabel("ΔNLL vs full (nats/token)")
    ax.set_title("GSM8K answers")
    ax = axes[1]
    if ret:
        rr = ret["rows"]
        _errorbar(ax, [r["skip_ratio"] for r in rr], rr, "retrieval_acc", color="C1",
                  label="ours: retrieval")
    ax.plot(t4["ratios"], [v / 100 for v in t4["HotpotQA"]], "s--", color="grey",
            label="paper: HotpotQA")
    ax.plot(t4["ratios"], [v / 100 for v in t4["GSM8K"]], "^:", color="black",
            label="paper: GSM8K")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("skip ratio")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    ax.set_title("Task accuracy")
    ax = axes[2]
    _speedups(ax, ratios, rows)
    ax.plot(ratios, [r.get("ideal_speedup") for r in rows], "x:", color="C1",
            label="ours: ideal (FLOPs)")
    ax.plot(t4["ratios"], t4["prefill_speedup"], "s--", color="grey", label="paper (A100)")
    ax.set_xlabel("skip ratio")
    ax.set_ylabel("prefill speedup")
    ax.legend(fontsize=8)
    ax.set_title("Prefill speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
