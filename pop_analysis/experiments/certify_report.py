"""The certification simulation on stored per-item losses, as the docs show it: both procedures
on random splits of each model's pool (quality/guarantee_sim.py), one certificate per model from
the pool's first items, the docs' lines and the plot. scripts/certify_sim.py runs it;
tests/unit/test_docs_methods.py regenerates the lines from the stored pools and checks the docs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pop_analysis.engine.skipset import describe
from pop_analysis.experiments.item_losses import load_table
from pop_analysis.quality.guarantee import bad_items, fixed_sequence, risk_bound
from pop_analysis.quality.guarantee_sim import simulate

RAW = Path("docs/reproduction/raw")
MODELS = ("smollm2-135m", "gemma3-270m")


def done_items(table) -> int:
    """How many leading items every set (and the full model) has a loss for."""
    rows = [table.full, *table.nll.values()]
    return next((i for i in range(table.n) if any(r[i] is None for r in rows)), table.n)


def bad_matrix(table, epsilon: float, n: int) -> np.ndarray:
    return np.stack([bad_items(table.delta(s)[:n], epsilon) for s in table.sets], 1)  # (n, m)


def certificate(table, bad, alpha, eps, delta, n_sel, n_cert) -> dict:
    """The certified procedure once: selection = the pool's first n_sel items, certification =
    the next n_cert (GSM8K test items in file order)."""
    sel, cer = bad[:n_sel], bad[n_sel:n_sel + n_cert]
    over = np.flatnonzero(sel.mean(0) > alpha)
    m = over[0] + 1 if len(over) else bad.shape[1]
    last, bounds = fixed_sequence([lambda j=j: risk_bound(cer[:, j], alpha, delta)
                                   for j in range(m)], delta)
    seq = [{"set": describe(table.sets[j]), "selection_rate": float(sel[:, j].mean()),
            "bad": int(b.bad), "n": b.n, "upper": b.upper, "passed": b.passes(delta)}
           for j, b in enumerate(bounds)]
    chosen = table.sets[last] if last >= 0 else ()
    d = np.asarray(table.delta(chosen)[n_sel:n_sel + n_cert]) if last >= 0 else None
    return {"certified": describe(chosen) if last >= 0 else None, "k": len(chosen),
            "bound": bounds[max(last, 0)].upper, "rate": bounds[max(last, 0)].rate,
            "sequence": seq, "mean_delta_nll_estimate": float(d.mean()) if d is not None else None,
            "selection": f"pool items 0-{n_sel - 1}",
            "certification": f"pool items {n_sel}-{n_sel + n_cert - 1}"}


def plot(results: dict, out: Path, alpha: float, delta: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = list(results)
    for i, (proc, colour) in enumerate((("certified", "#2a7"), ("same_items", "#c33"))):
        v = [results[m]["violations"][proc] for m in names]
        x = np.arange(len(names)) + (i - 0.5) * 0.35
        axes[0].bar(x, [e["rate"] for e in v], 0.35, color=colour,
                    yerr=np.array([[e["rate"] - e["ci"][0] for e in v],
                                   [e["ci"][1] - e["rate"] for e in v]]),
                    label="certified (separate items)" if proc == "certified"
                    else "same items (today's choose)")
    axes[0].axhline(delta, color="k", ls="--", lw=1, label=f"δ = {delta:g}")
    axes[0].set_xticks(range(len(names)), names)
    axes[0].set_ylabel(f"share of splits whose set's rate > α = {alpha:g}")
    axes[0].set_title("violation rate (95% Clopper-Pearson over splits)")
    axes[0].legend(fontsize=8)
    for m, marker in zip(names, "os"):
        rates = results[m]["pool_rates"]
        axes[1].plot(range(1, len(rates) + 1), rates, marker=marker, label=m)
    axes[1].axhline(alpha, color="k", ls="--", lw=1, label=f"α = {alpha:g}")
    axes[1].set_xlabel("candidate (tail block of k layers)")
    axes[1].set_ylabel("bad-item rate on the whole pool")
    axes[1].set_title("the candidates' true rates")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def markdown(out: dict, plot_rel: str) -> list[str]:
    """The docs' lines: one row per model and procedure, the certificates, the plot."""
    a, e, d = out["alpha"], out["epsilon"], out["delta"]
    md = [f"| model | pool items (planned) | selection / certification items | candidates | "
          f"procedure | splits where a set was chosen | violation rate (rate > α on the pool) "
          f"[95%] | on the rest of the pool |", "|---|---|---|---|---|---|---|---|"]
    for m, r in out["models"].items():
        for proc, name in (("certified", "certified (selection and certification split)"),
                           ("same_items", "same items (largest set whose bound meets α)")):
            v = r["violations"][proc]
            md.append(f"| {m} | {r['n_pool']} ({r['n_planned']}) | {r['n_sel']} / {r['n_cert']} "
                      f"| {len(r['sets'])} tail blocks "
                      f"| {name} | {r['chosen_share'][proc]:.0%} | {v['rate']:.3f} "
                      f"[{v['ci'][0]:.3f}, {v['ci'][1]:.3f}] | {v['rest_rate']:.3f} |")
    md += ["", f"α = {a:g}, ε = {e:g} nats per token, δ = {d:g}; {out['splits']} random splits "
           f"of each pool (the same-items procedure chooses and reports on the selection and "
           f"certification items together). A valid procedure stays under δ plus the Monte-Carlo "
           f"error "
           f"(1.96·sqrt(δ(1−δ)/splits) = {1.96 * (d * (1 - d) / out['splits']) ** 0.5:.3f}).", ""]
    for m, r in out["models"].items():
        c = r["certificate"]
        what = (f"layers {c['certified']} ({c['k']} layers): {c['rate']:.3f} of the certification "
                f"items bad, upper bound {c['bound']:.3f} <= {a:g}" if c["certified"] else
                f"nothing: the smallest set's bound is {c['bound']:.3f}")
        md.append(f"- {m}, selection = {c['selection']}, certification = {c['certification']}: "
                  f"certified {what}.")
    return md + ["", f"![violation rates and the candidates' rates]({plot_rel})", ""]


def run(alpha: float, epsilon: float, delta: float, splits: int, root: Path = RAW,
        selection: int = 0, cert: int = 0) -> dict:
    """The simulation of every model's pool (the items computed so far): sizes default to a
    sixth and a half of the pool."""
    results = {}
    for model in MODELS:
        table = load_table(root / model / "pool.json")
        n = done_items(table)
        bad = bad_matrix(table, epsilon, n)
        n_sel, n_cert = selection or round(n / 6), cert or round(n / 2)
        sim = simulate(bad, alpha, delta, n_sel, n_cert, splits, seed=0)
        results[model] = {"n_pool": n, "n_planned": table.n, "n_sel": n_sel, "n_cert": n_cert,
                          "sets": [describe(s) for s in table.sets],
                          "pool_rates": sim.pool_rates, "violations": sim.violations,
                          "chosen_share": sim.chosen_share, "mc_margin": sim.mc_margin(),
                          "certificate": certificate(table, bad, alpha, epsilon, delta, n_sel,
                                                     n_cert)}
    return {"alpha": alpha, "epsilon": epsilon, "delta": delta, "splits": splits,
            "models": results}
