"""Tables and the frontier plot from bench/precision_bench.py's raw outputs (bench/raw/precision_bench:
each stage's newest run).

Quality estimates are recomputed from the per-item values (slices of one model's items merged):
paired differences against the full model with BCa intervals, means with t intervals
(pop_analysis.quality.stats). Writes docs/precision/frontier_<model>.png.
"""
from __future__ import annotations

import json
from pathlib import Path

from pop_analysis.quality import stats

from bench_results import latest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("pop", "int8 prefill", "uniform int8", "pop + int8 prefill")


def _load(out: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in latest(out, pattern)]


def merged_quality(out: Path, model: str) -> dict | None:
    """Per-item values of every slice of `model`'s quality run, in item order."""
    parts = sorted(_load(out, f"quality_{model}*.json"), key=lambda d: d.get("start", 0))
    if not parts:
        return None
    per, drift = {}, {}
    for d in parts:
        for name, metrics in d["per_item"].items():
            for m, vals in metrics.items():
                per.setdefault(name, {}).setdefault(m, []).extend(vals)
        for name, metrics in d["drift"].items():
            for m, vals in metrics.items():
                drift.setdefault(name, {}).setdefault(m, []).extend(vals)
    return {"per_item": per, "drift": drift, "n": sum(d["n"] for d in parts)}


def _ci(e) -> str:
    return f"{e.value:.4f} [{e.ci[0]:.4f}, {e.ci[1]:.4f}]"


def quality_rows(q: dict) -> list[dict]:
    full = q["per_item"]["full"]
    rows = []
    for name in CONFIGS:
        v, d = q["per_item"][name], q["drift"][name]
        rows.append({
            "config": name, "n": len(v["continuation_nll"]),
            "dnll": stats.paired_delta(v["continuation_nll"], full["continuation_nll"]),
            "agree": stats.mean_ci(v["greedy_agreement"], bounds=(0, 1)),
            "kl": stats.mean_ci(v["next_token_kl"], bounds=(0, float("inf"))),
            "kcos": stats.mean_ci(d["k"], bounds=(-1, 1)),
            "vcos": stats.mean_ci(d["v"], bounds=(-1, 1))})
    return rows


def kl_share(q: dict) -> tuple[float, tuple[float, float], int]:
    """The quality goal's figure: prefill-only int8's mean continuation KL over uniform int8's,
    with a paired BCa bootstrap interval (items resampled together), and n."""
    import numpy as np
    from scipy import stats as sps

    a = np.array(q["per_item"]["int8 prefill"]["next_token_kl"])
    b = np.array(q["per_item"]["uniform int8"]["next_token_kl"])
    ratio = lambda x, y, axis=-1: x.mean(axis=axis) / y.mean(axis=axis)  # noqa: E731
    ci = sps.bootstrap((a, b), ratio, paired=True, vectorized=True, n_resamples=10000,
                       method="BCa", random_state=0).confidence_interval
    return float(ratio(a, b)), (float(ci.low), float(ci.high)), len(a)


def _ttft_table(d: dict) -> list[str]:
    lines = ["| tokens | configuration | against | speedup | IQR | rounds | flag |",
             "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        lines.append(f"| {r['tokens']} | {r['config']} | {r['against']} | {r['speedup']:.2f}x | "
                     f"{r['iqr'][0]:.2f}-{r['iqr'][1]:.2f} | {r['rounds']} | "
                     f"{r['note'] or 'trusted'} |")
    return lines


def _quality_table(rows) -> list[str]:
    lines = ["| configuration | n | ΔNLL vs full | 64-token agreement | continuation KL | "
             "cache K cos | cache V cos |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['n']} | {_ci(r['dnll'])} | {_ci(r['agree'])} | "
                     f"{_ci(r['kl'])} | {_ci(r['kcos'])} | {_ci(r['vcos'])} |")
    return lines


def _plan_table(d: dict) -> list[str]:
    c = d["check"]
    lines = [f"Budget (POP alone's predicted loss): {d['budget']:.4f}; the planner's plan "
             f"`{''.join(p[0].upper() for p in d['pick']['layers'])}` (predicted "
             f"{d['pick']['ms']:.1f} ms, loss {d['pick']['loss']:.4f}). Grid items n = "
             f"{d['grid_n']}; TTFT at the plan's prompt length.", "",
             "| configuration | plan | predicted loss | TTFT speedup | KL [95% CI] | flag |",
             "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        lines.append(f"| {r['name']} | `{r['plan']}` | {r['predicted_loss']:.4f} | "
                     f"{r['speedup']:.2f}x | {r['kl']:.4f} [{r['kl_ci'][0]:.4f}, "
                     f"{r['kl_ci'][1]:.4f}] | {r['note'] or 'trusted'} |")
    share = f"{c['share_of_best']:.2f}" if c["share_of_best"] is not None else "n/a"
    lines += ["", f"Exhaustive search over {c['searched']} configurations: the fastest at KL <= "
              f"the pick's ({c['pick_loss']:.4f}) is {c['best']} at {c['best_speedup']:.2f}x; the "
              f"pick reaches {share} of it. Frontier: {', '.join(d['frontier'])}."]
    return lines


def plot(model: str, ttft: dict | None, rows, tokens: int = 512) -> Path | None:
    """Speedup at `tokens` against KL, one point per configuration, with the KL interval."""
    if ttft is None or rows is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed = {r["config"]: r for r in ttft["rows"] if r["tokens"] == tokens and r["against"] == "full"}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.scatter([0], [1], color="#444444")
    ax.annotate("full", (0, 1), textcoords="offset points", xytext=(4, 4))
    for r in rows:
        if r["config"] not in speed:
            continue
        s, kl = speed[r["config"]], r["kl"]
        ax.errorbar([kl.value], [s["speedup"]], xerr=[[kl.value - kl.ci[0]], [kl.ci[1] - kl.value]],
                    yerr=[[s["speedup"] - s["iqr"][0]], [s["iqr"][1] - s["speedup"]]],
                    fmt="o" if s["trustworthy"] else "x", color="#9467bd" if "int8" in r["config"]
                    else "#2ca02c")
        ax.annotate(r["config"] + ("" if s["trustworthy"] else " (flagged)"),
                    (kl.value, s["speedup"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("continuation KL to the full model (nats/token, 95% CI)")
    ax.set_ylabel(f"TTFT speedup at {tokens} tokens (IQR)")
    ax.set_title(f"{model}: TTFT against quality")
    path = ROOT / "docs" / "precision" / f"frontier_{model}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _newest(out: Path, what: str) -> dict | None:
    """The newest raw output of one stage (files are named what__parameters__start.json)."""
    found = latest(out, f"{what}__*.json")
    return json.loads(found[-1].read_text()) if found else None


def report(out: Path) -> str:
    lines = []
    k = _newest(out, "kernels")
    if k:
        lines += [f"CPU: {k.get('cpu', 'not recorded')}; int8 instructions: "
                  f"{', '.join(k['int8_isa']) if k.get('int8_isa') else k.get('int8_isa', 'not recorded')}", ""]
        lines += [f"## Kernels (torch {k['torch']}, torchao {k['torchao']})", "",
                  "| model | proj | kernel | tokens | speedup | rel. error | flag |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['proj']} | {r['kernel']} | {r['tokens']} | "
                  f"{r['speedup']:.2f}x | {r['rel_error']:.4f} | {r['note'] or 'trusted'} |"
                  for r in k["rows"]]
    for model in ("smollm2-135m", "gemma3-270m"):
        ttft = _newest(out, f"ttft_{model}")
        q = merged_quality(out, model)
        rows = quality_rows(q) if q else None
        lines += ["", f"## {model}"]
        if ttft:
            m = ttft["memory"]
            lines += ["", f"TTFT ({ttft['threads']} threads; int8 copies "
                          f"{m['int8_bytes'] / 2**20:.1f} MiB beside {m['model_bytes'] / 2**20:.0f} "
                          f"MiB, {m['extra_share']:.0%})", ""] + _ttft_table(ttft)
        if rows:
            lines += ["", "Quality (GSM8K test, gold answers; paired against the full model)", ""]
            lines += _quality_table(rows)
            share, (lo, hi), n = kl_share(q)
            lines += ["", f"Prefill-only int8's continuation KL / uniform int8's: {share:.3f} "
                          f"[{lo:.3f}, {hi:.3f}] (paired BCa bootstrap, n = {n}; the goal: at most "
                          "1/3)"]
        plan = _newest(out, f"plan_{model}")
        if plan:
            lines += ["", "Planner against the grid", ""] + _plan_table(plan)
        png = plot(model, ttft, rows)
        if png:
            lines += ["", f"![frontier](precision/{png.name})"]
    return "\n".join(lines)
