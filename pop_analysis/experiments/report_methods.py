"""The report's "Which method picks the best prefill skip set" part: every importance method on
the same ranking prompts, then POP with each method's set per budget on held-out items (both
stored like the other parts), rendered as tables, verdict lines and PNG plots
(report_methods_plots.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.models import LoadedModel
from pop_analysis.experiments import methods_verdicts as mv
from pop_analysis.experiments.methods_compare import CompareConfig, cached_comparison, paired_from
from pop_analysis.experiments.methods_run import ImportanceConfig, cached_importance
from pop_analysis.importance.methods import METHODS, primary
from pop_analysis.quality import stats
from pop_analysis.quality.evalsets import NAMED, data_dir

DASH = "—"


@dataclass(frozen=True)
class MethodsReportConfig:
    """What the methods part measures (its own store keys: the tables' settings do not enter)."""

    n: int = 100  # ranking prompts, the same for every method
    dataset: str = "wizardlm"  # ranking prompts (WizardLM's test set, as the paper calibrates)
    eval_n: int = 100  # held-out items per skip set
    eval_dataset: str = "gsm8k"  # GSM8K test questions with their reference answers
    new_tokens: int = 32  # gate responses and drop-one continuations
    answer_tokens: int = 32  # reference tokens scored per held-out item
    random_seeds: int = 3  # draws of the random baseline per budget and shape

    def importance(self) -> ImportanceConfig:
        return ImportanceConfig(n_samples=self.n, new_tokens=self.new_tokens)

    def compare(self) -> CompareConfig:
        return CompareConfig(dataset=self.eval_dataset, n_samples=self.eval_n,
                             answer_tokens=self.answer_tokens, random_seeds=self.random_seeds)


def methods_part(lm: LoadedModel, cfg: MethodsReportConfig, compute: bool, use_cache: bool = True,
                 progress=None) -> dict | None:
    """{"importance": ..., "comparison": ... or None} as plain dicts, from the store (computed
    when `compute`); None when no importance run is stored or computed."""
    source = str(data_dir() / NAMED[cfg.dataset]) if cfg.dataset in NAMED else cfg.dataset
    prompts = load_prompts(source, limit=cfg.n)
    imp, _ = cached_importance(lm, prompts, cfg.importance(), use_cache or not compute, progress,
                               compute_missing=compute)
    if imp is None:
        return None
    cmp, _ = cached_comparison(lm, imp, cfg.compare(), use_cache or not compute, progress,
                               compute_missing=compute)
    return {"importance": imp.to_dict(), "comparison": cmp.to_dict() if cmp else None}


def _ci(v, ci, digits: int = 3, sign: bool = True) -> str:
    if v is None:
        return DASH
    f = (lambda x: f"{x:+.{digits}f}") if sign else (lambda x: f"{x:.{digits}f}")
    return f"{f(v)} [{f(ci[0])}, {f(ci[1])}]" if ci else f(v)


def _agree(imp: dict, a: str, b: str) -> str:
    ag = imp["agreement"]
    if a not in ag["names"] or b not in ag["names"]:
        return DASH
    i, j = ag["names"].index(a), ag["names"].index(b)
    return _ci(ag["kendall"][i][j], ag["kendall_ci"][i][j], 2, sign=False)


def methods_table(imp: dict) -> list[str]:
    lines = ["| method | what it measures | cost | series that picks its sets | Kendall τ with drop-one "
             "(prefill-only, ΔNLL) | Kendall τ with the gate (prefill) |", "|---|---|---|---|---|---|"]
    for m in imp["methods"]:
        meth, key = METHODS[m], primary(m)
        lines.append(f"| {meth.title} | {meth.teaching} | {meth.cost} | `{key}` "
                     f"| {_agree(imp, key, 'dropone.nll')} | {_agree(imp, key, 'gate.prefill')} |")
    return lines


def quality_table(cmp: dict, shape: str) -> list[str]:
    """Rows: methods (random as min / median / max of its draws); columns: one per distinct k
    (budgets that give the same k share a column); ΔNLL [95%] · layers."""
    rows = [r for r in cmp["rows"] if r["shape"] == shape]
    cols = [(k, bs) for k, s, bs in mv.cells(rows)]
    lines = ["| method | " + " | ".join(f"{mv.budgets_label(bs)} ({k} layers)" for k, bs in cols)
             + " |", "|---|" + "---|" * len(cols)]
    for m in dict.fromkeys(r["method"] for r in rows):
        cells = []
        for k, bs in cols:
            group = [r for r in rows if r["method"] == m and r["budget"] == bs[0]]
            if m == "random":
                ds = sorted(r["continuation_nll_delta"] for r in group)
                cells.append(f"{ds[0]:+.3f} / {ds[len(ds) // 2]:+.3f} / {ds[-1]:+.3f}" if ds else DASH)
            elif group:
                r = group[0]
                cells.append(f"{_ci(r['continuation_nll_delta'], r.get('continuation_nll_delta_ci'))}"
                             f" · {r['set']}")
            else:
                cells.append(DASH)
        label = METHODS[m].title + (" (min / median / max of draws)" if m == "random" else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def speed_table(cmp: dict) -> list[str]:
    """Per distinct k and shape: the FLOP ideal and the measured speedups of the methods' sets."""
    lines = ["| budget | shape | ideal speedup | measured (median of each set's rounds; range over "
             "sets) | sets flagged by the timing protocol |", "|---|---|---|---|---|"]
    for k, shape, bs in sorted(mv.cells(cmp["rows"]), key=lambda c: (c[2][0], c[1])):
        cell = [r for r in cmp["rows"] if r["budget"] == bs[0] and r["shape"] == shape]
        rows = [r for r in cell if r.get("prefill_speedup") is not None]
        ideal = sorted({round(r["ideal_speedup"], 2) for r in cell})
        head = f"| {mv.budgets_label(bs)} | {shape} | {ideal[0]:.2f}-{ideal[-1]:.2f} "
        if not rows:
            lines.append(head + "| not timed | |")
            continue
        med = sorted(r["prefill_speedup"] for r in rows)
        flagged = sum(r.get("timing_trustworthy") is False for r in rows)
        lines.append(head + f"| {med[len(med) // 2]:.2f} ({med[0]:.2f}-{med[-1]:.2f}, "
                     f"{len(rows)} sets) | {flagged} of {len(rows)} |")
    return lines


def tail_lines(verdicts: list[dict]) -> list[str]:
    """Where the tail baseline wins, ties or loses, counted over distinct cells (ties are not
    wins; budgets of one k are one cell)."""
    c = mv.counts(verdicts)
    listed = lambda xs: f" ({', '.join(xs)})" if xs else ""  # noqa: E731
    out = [f"Of {c['cells']} distinct budget and shape cells, the tail's set is the best alone in "
           f"{len(c['tail_alone'])}{listed(c['tail_alone'])}; it is best together with other "
           f"methods that pick the identical set in {len(c['tail_tied'])}"
           f"{listed(c['tail_tied'])}; another method's set is best in {len(c['other'])}"
           f"{listed(c['other'])}."]
    merged = mv.merged_budgets(verdicts)
    if merged:
        out.append(f"Budgets that give the same k are one cell: {'; '.join(merged)}.")
    beaten = [f"{cell} ({mv.title_list(v['best_methods'])}, {_ci(v['vs_tail'], v['vs_tail_ci'])})"
              for cell, v in c["beats_tail"]]
    out.append(f"A method's set beats the tail's with a paired interval clear of 0 in "
               f"{len(beaten)} cells" + (": " + "; ".join(beaten) if beaten else "") + ".")
    if c["tail_beats"]:
        out.append("The tail's set beats, with a paired interval clear of 0, the sets of "
                   + ", ".join(f"{METHODS[m].title} (in {n} cells)"
                               for m, n in c["tail_beats"].items()) + ".")
    return out


def gate_vs_dropone(imp: dict, cmp: dict | None) -> list[str]:
    """How the gate's ranking compares with drop-one, the ground truth."""
    if "dropone.nll" not in imp["series"] or "gate.prefill" not in imp["series"]:
        return []
    out = [f"Kendall τ between the gate's prefill ranking and drop-one's: "
           f"{_agree(imp, 'gate.prefill', 'dropone.nll')} (Spearman "
           f"{_spear(imp, 'gate.prefill', 'dropone.nll')}); the gate's decode ranking against "
           f"drop-one: {_agree(imp, 'gate.decode', 'dropone.nll')}."]
    seen = set()
    for r in (cmp or {}).get("rows", []):
        if r["method"] != "gate" or (r["k"], r["shape"]) in seen:
            continue
        seen.add((r["k"], r["shape"]))
        truth = next(t for t in cmp["rows"] if t["method"] == "dropone" and t["budget"] == r["budget"]
                     and t["shape"] == r["shape"])
        d = _paired(cmp, r["set"], truth["set"])
        bs = next(b for k, sh, b in mv.cells(cmp["rows"]) if (k, sh) == (r["k"], r["shape"]))
        out.append(f"{mv.budgets_label(bs)} {r['shape']}: the gate picks {r['set']}, drop-one {truth['set']} "
                   f"(Jaccard {r['jaccard_dropone']:.2f}); ΔNLL gate − drop-one {d}.")
    return out


def _spear(imp: dict, a: str, b: str) -> str:
    ag = imp["agreement"]
    i, j = ag["names"].index(a), ag["names"].index(b)
    return _ci(ag["spearman"][i][j], ag["spearman_ci"][i][j], 2, sign=False)


def _paired(cmp: dict, a: str, b: str) -> str:
    if a == b:
        return "0 (the same set)"
    d = stats.paired_delta(cmp["item_nll"][a], cmp["item_nll"][b])
    word = stats.NO_CHANGE if d.includes(0.0) else ("the gate's set is worse" if d.value > 0
                                                      else "the gate's set is better")
    return f"{_ci(d.value, d.ci)} ({word})"


def counted(rows: list[dict], verdicts: list[dict], n: int, shapes, figure: str = "") -> list[str]:
    """The verdicts, the tail baseline's counts and the ΔNLL tables: the parts regenerated from
    raw results (methods_raw.py) and checked against the docs."""
    md = [f"## Verdicts (n = {n} held-out items per set)", "",
          *[f"- {v['line']}" for v in verdicts], "", "## The tail baseline", "",
          *[f"- {x}" for x in tail_lines(verdicts)], ""]
    md += [figure, ""] if figure else []
    for shape in shapes:
        md += [f"## ΔNLL of each method's set ({shape}; ΔNLL [95%] · layers)", "",
               *quality_table({"rows": rows}, shape), ""]
    return md


def render_methods(model: str, part: dict, figs: Path, rel: str, command: str) -> list[str]:
    """The section's Markdown lines; its PNGs are written to `figs` (linked as `rel`)."""
    from pop_analysis.experiments.report_methods_plots import (plot_agreement, plot_curves,
        plot_frontier, plot_triangle)

    imp, cmp = part["importance"], part.get("comparison")
    figs.mkdir(parents=True, exist_ok=True)
    md = [f"# Which method picks the best prefill skip set ({model})", "",
          f"Regenerate with `{command}`. Every method ranks layers on the same "
          f"{imp['n_samples']} prompts of `{imp['dataset']}` (chat template); larger = more "
          "important. A method's skip set for a budget of k layers is its k lowest layers (free) "
          "or its contiguous block of k with the lowest summed score (block); POP runs each set "
          "on held-out items it never ranked on, and ΔNLL is paired against the full model over "
          "those items (BCa bootstrap, 95%). Measured on the project's shared 2-core CPU machine: "
          "wall times and speedups carry the load of other processes (the timing protocol flags "
          "what it cannot trust).", "", "## Conditions", "",
          "| part | what | n | wall time |", "|---|---|---|---|"]
    for p, s in imp["seconds"].items():
        md.append(f"| {p} | {imp['tokens'].get(p, '')} | {imp['n_samples']} prompts | "
                  f"{s / 60:.1f} min{' (stored earlier)' if imp['stored'].get(p) == 'stored' else ''} |")
    if cmp:
        md.append(f"| comparison | {cmp['data']}: reference answers cut to "
                  f"{cmp['config']['answer_tokens']} tokens, {len({r['set'] for r in cmp['rows']})} "
                  f"distinct sets | {cmp['n']} items | {cmp['seconds'] / 60:.1f} min |")
    md += ["", "## The methods", "", *methods_table(imp), ""]
    plot_curves(imp, figs / "methods_curves.png")
    plot_agreement(imp, figs / "methods_agreement.png")
    md += [f"![every method's curve, normalised]({rel}/methods_curves.png)", "",
           f"![rank agreement (Kendall τ)]({rel}/methods_agreement.png)", ""]
    if imp.get("triangle"):
        plot_triangle(imp, figs / "methods_triangle.png")
        md += [f"![angular distance d(l, n) on the last token]({rel}/methods_triangle.png)", ""]
    md += ["## How the gate's ranking compares with drop-one (the ground truth)", "",
           *[f"- {x}" for x in gate_vs_dropone(imp, cmp)], ""]
    if not cmp:
        return md + ["The comparison of the methods' skip sets is not computed yet.", ""]
    plot_frontier(cmp, figs / "methods_frontier.png")
    vs = mv.verdicts(cmp["rows"], paired_from(cmp["item_nll"]))
    md += counted(cmp["rows"], vs, cmp["n"], cmp["config"]["shapes"],
                  f"![quality against k, one frontier per method]({rel}/methods_frontier.png)")
    md += ["## Prefill speedup of the sets (512-token prompt)", "", *speed_table(cmp), ""]
    return md
