"""The certification simulation on stored per-item losses (docs/importance.md): both procedures
on random splits of each model's pool, violation rates with their Monte-Carlo error, a plot, and
one certificate per model from the pool's first items; results to docs/reproduction/raw/.

  .venv/bin/python scripts/certify_sim.py --alpha 0.1 --epsilon 0.1 --delta 0.05 --splits 1000
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pop_analysis.engine.skipset import describe
from pop_analysis.experiments.item_losses import complete, load_table
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
    md = [f"| model | pool items (planned) | candidates | procedure | splits where a set was "
          f"chosen | violation rate (rate > α on the pool) [95%] | on the rest of the pool |",
          "|---|---|---|---|---|---|---|"]
    for m, r in out["models"].items():
        for proc, name in (("certified", "certified (selection and certification split)"),
                           ("same_items", "same items (largest set whose bound meets α)")):
            v = r["violations"][proc]
            md.append(f"| {m} | {r['n_pool']} ({r['n_planned']}) | {len(r['sets'])} tail blocks "
                      f"| {name} | {r['chosen_share'][proc]:.0%} | {v['rate']:.3f} "
                      f"[{v['ci'][0]:.3f}, {v['ci'][1]:.3f}] | {v['rest_rate']:.3f} |")
    md += ["", f"α = {a:g}, ε = {e:g} nats per token, δ = {d:g}; {out['splits']} random splits; "
           f"selection {out['n_sel']} items, certification {out['n_cert']} items (the same-items "
           f"procedure chooses and reports on all {out['n_sel'] + out['n_cert']}). A valid "
           f"procedure stays under δ plus the Monte-Carlo error "
           f"(1.96·sqrt(δ(1−δ)/splits) = {1.96 * (d * (1 - d) / out['splits']) ** 0.5:.3f}).", ""]
    for m, r in out["models"].items():
        c = r["certificate"]
        what = (f"layers {c['certified']} ({c['k']} layers): {c['rate']:.3f} of the certification "
                f"items bad, upper bound {c['bound']:.3f} <= {a:g}" if c["certified"] else
                f"nothing: the smallest set's bound is {c['bound']:.3f}")
        md.append(f"- {m}, selection = {c['selection']}, certification = {c['certification']}: "
                  f"certified {what}.")
    return md + ["", f"![violation rates and the candidates' rates]({plot_rel})", ""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--selection", type=int, default=100)
    p.add_argument("--cert", type=int, default=300)
    p.add_argument("--splits", type=int, default=1000)
    p.add_argument("--plot", type=Path, default=Path("docs/img/certify_simulation.png"))
    p.add_argument("--partial", action="store_true",
                   help="use the items computed so far when a pool is not complete")
    args = p.parse_args()
    results = {}
    for model in MODELS:
        table = load_table(RAW / model / "pool.json")
        if not complete(table) and not args.partial:
            sys.exit(f"error: {model}'s pool is not complete yet (--partial uses what is done)")
        n = done_items(table)
        bad = bad_matrix(table, args.epsilon, n)
        sim = simulate(bad, args.alpha, args.delta, args.selection, args.cert, args.splits, seed=0)
        results[model] = {"n_pool": n, "n_planned": table.n, "sets": [describe(s) for s in table.sets],
                          "pool_rates": sim.pool_rates, "violations": sim.violations,
                          "chosen_share": sim.chosen_share, "mc_margin": sim.mc_margin(),
                          "certified_k": np.bincount(np.asarray(sim.certified) + 1).tolist(),
                          "same_items_k": np.bincount(np.asarray(sim.same_items) + 1).tolist(),
                          "certificate": certificate(table, bad, args.alpha, args.epsilon,
                                                     args.delta, args.selection, args.cert)}
    out = {"alpha": args.alpha, "epsilon": args.epsilon, "delta": args.delta,
           "n_sel": args.selection, "n_cert": args.cert, "splits": args.splits, "models": results}
    (RAW / "certify_simulation.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(results, args.plot, args.alpha, args.delta)
    (RAW / "certify_simulation.md").write_text("\n".join(markdown(out, "img/" + args.plot.name)))
    print(json.dumps({m: {"violations": r["violations"], "chosen": r["chosen_share"],
                          "certificate": {k: r["certificate"][k] for k in ("certified", "bound", "rate")}}
                      for m, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
