"""The reproduction report as Markdown with PNG plots (report_plots.py), beside the paper's
numbers, with what matches the paper and what does not (report_checks.py)."""
from __future__ import annotations

from pathlib import Path

from pop_analysis.engine.skipset import describe
from pop_analysis.experiments.paper import PAPER_TABLES
from pop_analysis.experiments.report import PARTS, ReportConfig
from pop_analysis.experiments.report_checks import findings
from pop_analysis.experiments.report_doc import place, slug
from pop_analysis.quality.summary import delta_text

NAMES = {"full": "full model", "pop": "POP (last 1/3)", "shallow": "shallow pruning",
         "interleaved": "interleaved pruning", "pop_no_kv": "w/o independent KV",
         "pop_no_boundary": "w/o boundary handling", "static": "static removal (prefill+decode)"}
DASH = "—"


def num(v, ci=None, digits: int = 3, pct: bool = False) -> str:
    """'0.512 [0.470, 0.550]' (or percent); a dash where there is no value."""
    if v is None:
        return DASH
    f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.{digits}f}")
    return f"{f(v)} [{f(ci[0])}, {f(ci[1])}]" if ci else f(v)


def delta(row: dict | None, m: str, pct: bool = False, digits: int = 3) -> str:
    """quality.delta_text, a dash where the row has no difference from the full model."""
    return (row and delta_text(row, m, pct, digits)) or DASH


def by(rows, key: str = "variant") -> dict:
    return {r[key]: r for r in rows or []}


def speed(row: dict | None) -> str:
    """The timing protocol's median speedup, its spread over rounds and the FLOP ideal; a
    flagged measurement says why (never shown plain)."""
    if not row or row.get("prefill_speedup") is None:
        return DASH
    lo, hi = row.get("speedup_range") or (None, None)
    spread = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and row.get("timing_rounds") else ""
    text = f"{row['prefill_speedup']:.2f}{spread} (ideal {row['ideal_speedup']:.2f})"
    if row.get("timing_trustworthy") is False:
        text += f" ⚠ {row.get('timing_note') or 'noisy'}"
    return text


def quality_cells(r: dict, rr: dict | None) -> str:
    """NLL, its difference, KL, top-1 (GSM8K answers: r) and retrieval with its difference (rr)."""
    return (f"| {num(r.get('continuation_nll'), r.get('continuation_nll_ci'))} "
            f"| {delta(r, 'continuation_nll')} "
            f"| {num(r.get('next_token_kl'), r.get('next_token_kl_ci'))} "
            f"| {num(r.get('next_token_top1'), r.get('next_token_top1_ci'), pct=True)} "
            f"| {num(rr and rr.get('retrieval_acc'), rr and rr.get('retrieval_acc_ci'), pct=True)} "
            f"| {delta(rr, 'retrieval_acc', pct=True)}")


def table3(res: dict, ret: dict | None, length: int) -> list[str]:
    rows, rrows = by(res["rows"]), by((ret or {}).get("rows"))
    paper = PAPER_TABLES["table3"]["rows"]
    lines = [f"| variant | skipped layers | NLL, GSM8K answers | ΔNLL vs full | KL(full ‖ variant) "
             f"| top-1 = full | retrieval@{length} | Δ retrieval vs full | prefill speedup "
             "| paper GSM8K | paper HotpotQA |", "|" + "---|" * 11]
    for v, r in rows.items():
        rr = rrows.get(v)
        p = paper.get(v, [None, None])
        lines.append(
            f"| {NAMES.get(v, v)} | {describe(r['skip_layers'])} "
            f"{quality_cells(r, rr)} | {speed(r)} "
            f"| {p[0] if p[0] is not None else DASH} | {p[1] if p[1] is not None else DASH} |")
    return lines


def table4(res: dict, ret: dict | None, length: int) -> list[str]:
    t4 = PAPER_TABLES["table4"]
    paper = {round(r, 2): i for i, r in enumerate(t4["ratios"])}
    rrows = by((ret or {}).get("rows"), "skip_ratio")
    lines = [f"| ratio | skipped | NLL, GSM8K answers | ΔNLL vs full | KL(full ‖ POP) | top-1 = full "
             f"| retrieval@{length} | Δ retrieval vs full | prefill speedup | paper speedup "
             "| paper GSM8K | paper HotpotQA |", "|" + "---|" * 12]
    for r in res["rows"]:
        rr, i = rrows.get(r["skip_ratio"]), paper.get(round(r["skip_ratio"], 2))
        p = [t4[k][i] if i is not None else DASH for k in ("prefill_speedup", "GSM8K", "HotpotQA")]
        lines.append(
            f"| {r['skip_ratio']:.2f} | {describe(r['skip_layers'])} "
            f"{quality_cells(r, rr)} | {speed(r)} | {p[0]} | {p[1]} | {p[2]} |")
    return lines


def length_table(res: dict) -> list[str]:
    lines = ["| prompt tokens | n | full model | POP | Δ POP vs full |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        if not r.get("n"):
            continue
        lines.append(f"| {r.get('item_tokens') or r['length']} | {r['n']} "
                     f"| {num(r.get('full_retrieval_acc'), r.get('full_retrieval_acc_ci'), pct=True)} "
                     f"| {num(r.get('retrieval_acc'), r.get('retrieval_acc_ci'), pct=True)} "
                     f"| {delta(r, 'retrieval_acc', pct=True)} |")
    return lines


def mc_table(res: dict) -> list[str]:
    lines = ["| task | variant | n | accuracy (acc_norm) | Δ vs full |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['task']} | {r['variant']} | {r['n']} "
                     f"| {num(r['acc'], r['acc_ci'], pct=True)} | {delta(r, 'acc', pct=True)} |")
    return lines


def conditions(results: dict) -> list[str]:
    lines = ["| part | what | n | threads | device | wall time |", "|---|---|---|---|---|---|"]
    for part, res in results.items():
        if res is None:
            lines.append(f"| {part} | not computed yet | | | | |")
            continue
        rows = res.get("rows") or []
        n = max((r.get("n") or 0 for r in rows), default=0)
        lines.append(f"| {part} | {res.get('data', 'lm-eval local tasks')} | {n} "
                     f"| {res.get('threads', DASH)} | {res.get('device', DASH)} "
                     f"| {res.get('seconds', 0) / 60:.1f} min |")
    return lines


def write_report(results: dict, cfg: ReportConfig, model: str, out: Path, command: str) -> Path:
    """The model's section of the docs-style Markdown at `out` (e.g. docs/reproduction.md; other
    models' sections are kept) and its PNGs in a folder beside it, one sub-folder per model."""
    from pop_analysis.experiments.report_plots import plot_table3, plot_table4

    figs = out.with_suffix("") / slug(model)
    figs.mkdir(parents=True, exist_ok=True)
    rel = f"{out.stem}/{figs.name}"  # the figures as the document links them
    t3, t3r, t4, t4r = (results.get(p) for p in ("table3", "table3_retrieval", "table4",
                                                 "table4_retrieval"))
    L = cfg.retrieval_length
    md = [f"# Reproducing the paper's Tables 3 and 4 on {model}", "",
          f"Regenerate with `{command}`. Every quality number has n and a 95% interval; a "
          "difference from the full model is paired over the same items (BCa bootstrap for NLL, "
          "KL and agreement; McNemar's exact test for accuracies) and an interval that includes "
          "0 reads \"no measurable change\". NLL is the mean per-token negative log-likelihood "
          "of the reference GSM8K answer, the prompt read by the variant and the answer "
          "teacher-forced; KL and top-1 compare the variant's next-token distribution with the "
          "full model's on every answer token. Retrieval: the synthetic pass-code task "
          f"(one distractor, the key named before and after the notes, ~{L} tokens), greedy "
          "exact match of the first number generated. Speedups are prefill (TTFT) "
          "ratios from the timing protocol (full and variant alternated, order swapped every "
          "round, median with the interquartile range of the rounds in brackets) on this "
          "machine's CPU.", "", "## Conditions", "",
          *conditions(results), ""]
    md += ["## What matches the paper and what does not", ""]
    md += [f"- {line}" for line in findings(results)] + [""]
    if t3:
        md += [f"## Table 3: design ablations (n = {cfg.n} per cell)", "", *table3(t3, t3r, L), ""]
        md += [f"![Table 3]({rel}/table3.png)", ""]
        plot_table3(t3, t3r, figs / "table3.png")
    if t4:
        md += [f"## Table 4: pruning ratio (n = {cfg.n} per cell)", "", *table4(t4, t4r, L), ""]
        md += [f"![Table 4]({rel}/table4.png)", ""]
        plot_table4(t4, t4r, figs / "table4.png")
    if results.get("length"):
        md += ["## Retrieval: the full model's own score beside POP's", "",
               *length_table(results["length"]), ""]
    if results.get("mc"):
        md += ["## Multiple choice through lm-eval (local tasks over GSM8K, offline)", "",
               "`pop_gsm8k_final`: after the worked solution, which number follows '####' "
               "(gold and three other problems' answers). `pop_gsm8k_solution`: which worked "
               "solution belongs to the question (gold and three others).", "",
               *mc_table(results["mc"]), ""]
    missing = [p for p in PARTS if results.get(p) is None]
    if missing:
        md += [f"Not computed yet: {', '.join(missing)}.", ""]
    out.write_text(place(out, model, md), encoding="utf-8")
    return out
