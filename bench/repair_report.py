"""Markdown tables from bench/repair_bench.py's raw outputs (bench/raw/repair_bench/: the newest
run of each stage)."""
from __future__ import annotations

import json
from pathlib import Path

from pop_analysis.repair.evaluate import no_gap

from bench_results import latest

NAMES = ("builtin", "gsm8k_train")


def _load(folder: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in latest(folder, pattern)]


def _ci(x) -> str:
    return "" if not x else f" [{x[0]:.3f}, {x[1]:.3f}]"


def _share(pop: dict, r: dict, metric: str) -> str:
    """The share of POP's gap closed, or n/a where POP's own gap is not measurable."""
    v, ci = r[f"{metric}_gap_closed"], r[f"{metric}_gap_closed_ci"]
    if v is None or no_gap(pop, metric):
        return "n/a (POP's gap not measurable)"
    return f"{100 * v:.0f}%" + ("" if not ci else f" [{100 * ci[0]:.0f}%, {100 * ci[1]:.0f}%]")


def fits(folder: Path) -> str:
    lines = ["| skip | repair | distinct tokens | fit time (collect) | extra memory | "
             "last layer R2 K / V: POP -> fit |", "|---|---|---|---|---|---|"]
    for f in _load(folder, "fit_*.json"):
        for name, r in f["repairs"].items():
            last = r["fit"][str(f["skip"][-1])]
            lines.append(
                f"| {f['skip'][0]}-{f['skip'][-1]} | {name} | {r['n_tokens']} | "
                f"{r['seconds']:.1f} s ({r['collect_s']:.1f} s) | "
                f"{r['repair_bytes'] / 2**20:.1f} MiB ({100 * r['share']:.1f}% of "
                f"{r['model_bytes'] / 2**20:.0f} MiB) | {last['k_r2_pop']:.2f} -> "
                f"{last['k_r2_loo']:.2f} / {last['v_r2_pop']:.2f} -> {last['v_r2_loo']:.2f} |")
    return "\n".join(lines)


def _repair_rows(folder: Path, pattern: str):
    """(result file, skip label, repair name) for each repair measured in each file."""
    for q in _load(folder, pattern):
        for name in NAMES:
            if name in q["summary"]:
                yield q, f"{q['skip'][0]}-{q['skip'][-1]}", name


def quality(folder: Path) -> str:
    lines = ["| data | skip | n | full NLL | POP NLL - full | repair | repaired NLL - full | "
             "NLL gap closed | KL(full ‖ x): POP -> repaired | KL gap closed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for q, skip, name in _repair_rows(folder, "quality_*.json"):
        s = q["summary"]
        pop, r = s["pop"], s[name]
        lines.append(
            f"| {q['data']} | {skip} | {q['n']} | {s['full']['continuation_nll']:.3f} | "
            f"{pop['continuation_nll_delta']:.3f}{_ci(pop['continuation_nll_delta_ci'])} | "
            f"{name} | {r['continuation_nll_delta']:.3f}{_ci(r['continuation_nll_delta_ci'])}"
            f" | {_share(pop, r, 'continuation_nll')}"
            f" | {pop['next_token_kl']:.3f}{_ci(pop['next_token_kl_ci'])} -> "
            f"{r['next_token_kl']:.3f}{_ci(r['next_token_kl_ci'])} | "
            f"{_share(pop, r, 'next_token_kl')} |")
    return "\n".join(lines)


def retrieval(folder: Path) -> str:
    lines = ["| data | skip | n | full | POP | repair | repaired | repaired - POP (McNemar p) |",
             "|---|---|---|---|---|---|---|---|"]
    for q, skip, name in _repair_rows(folder, "quality_*retrieval*.json"):
        s, per = q["summary"], q["per_item"]
        acc = {k: s[k].get("retrieval_acc") for k in ("full", "pop", name)}
        lines.append(f"| {q['data']} | {skip} | {q['n']} | {acc['full']:.2f} | "
                     f"{acc['pop']:.2f} | {name} | {acc[name]:.2f} | "
                     f"{_mcnemar(per[name]['answer_correct'], per['pop']['answer_correct'])} |")
    return "\n".join(lines)


def _mcnemar(a, b) -> str:
    from pop_analysis.quality.stats import StatsError, paired_accuracy_delta

    try:
        e = paired_accuracy_delta(a, b)
    except StatsError:
        return "n/a"
    return f"{e.value:+.2f}{_ci(e.ci)} (p = {e.p_value:.2f})"


def drift(folder: Path) -> str:
    lines = ["| skip | n | run | hidden | K | V | attention out | mean KL(full ‖ x), 8 steps |",
             "|---|---|---|---|---|---|---|---|"]
    for d in _load(folder, "drift_*.json"):
        skip = f"{d['skip'][0]}-{d['skip'][-1]}"
        pop = d["block_means"]["pop"]
        for name, b in d["block_means"].items():
            cells = [_drift_cell(b, pop, q, name != "pop")
                     for q in ("hidden_cos", "k_cos", "v_cos", "attn_out_cos", "kl")]
            lines.append(f"| {skip} | {d['n']} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _drift_cell(b: dict, pop: dict, q: str, paired: bool) -> str:
    """The block mean; for a repair, its paired change from POP over prompts with a 95%
    bootstrap interval (when the run kept per-prompt values)."""
    from pop_analysis.quality.stats import paired_delta

    text = f"{b[q]:.4f}" if q == "kl" else f"{b[q]:.3f}"
    if not paired or "per_prompt" not in b or "per_prompt" not in pop:
        return text
    e = paired_delta([p[q] for p in b["per_prompt"]], [p[q] for p in pop["per_prompt"]])
    return f"{text} ({e.value:+.3f} [{e.ci[0]:+.3f}, {e.ci[1]:+.3f}])"


def report(folder: Path) -> str:
    parts = [("Fits", fits), ("Continuation NLL and teacher-forced KL", quality),
             ("Retrieval", retrieval), ("Drift (block means over the skipped layers)", drift)]
    return "\n\n".join(f"### {title}\n\n{make(folder)}" for title, make in parts)
