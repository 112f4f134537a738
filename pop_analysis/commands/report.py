"""Reproduce the paper's Tables 3 and 4 (with intervals, plots and the retrieval and
multiple-choice checks) into a Markdown report under docs/."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from pop_analysis.commands._common import (
    COUNT,
    MAX_TOKENS,
    TOKENS,
    Num,
    NumList,
    add_model_args,
    emit_json,
    load,
    quiet_hf,
    writable,
)
from pop_analysis.experiments.report import PARTS, ReportConfig, ReportError, collect
from pop_analysis.experiments.report_doc import place, slug
from pop_analysis.experiments.report_methods import (
    MethodsReportConfig,
    methods_part,
    render_methods,
)
from pop_analysis.experiments.report_render import write_report
from pop_analysis.progress import terminal_bar
from pop_analysis.quality.evalsets import check_size
from pop_analysis.speed.timing import MAX_ROUNDS
from pop_analysis.store.paths import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "docs" / "reproduction.md"
METHODS_PART = "methods"


def add_arguments(p) -> None:
    add_model_args(p)
    d = ReportConfig()
    p.add_argument("--n", type=COUNT, default=d.n, help="items per cell of Tables 3 and 4")
    p.add_argument("--retrieval-length", type=TOKENS, default=d.retrieval_length,
                   help="prompt tokens of the tables' retrieval column")
    p.add_argument("--lengths", type=NumList(TOKENS), default=",".join(map(str, d.lengths)),
                   help="prompt lengths of the full-vs-POP retrieval check")
    p.add_argument("--length-n", type=COUNT, default=d.length_n, help="retrieval items per length")
    p.add_argument("--mc-n", type=COUNT, default=d.mc_n, help="documents per multiple-choice task")
    p.add_argument("--greedy-tokens", type=Num(int, 0, MAX_TOKENS), default=d.greedy_tokens,
                   help="greedy tokens compared on GSM8K (0: teacher-forced metrics only)")
    p.add_argument("--repeats", type=Num(int, 1, MAX_ROUNDS), default=d.repeats,
                   help="timed rounds per speedup")
    m = MethodsReportConfig()
    p.add_argument("--methods-n", type=COUNT, default=m.n,
                   help="methods part: ranking prompts (WizardLM test set) for every method")
    p.add_argument("--methods-eval-n", type=COUNT, default=m.eval_n,
                   help="methods part: held-out GSM8K items per skip set")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"parts to compute now (others come from the cache): {', '.join(PARTS)}; "
                        f"and {METHODS_PART} (which importance method picks the best skip set: "
                        "hours on a CPU, so only when named)")
    p.add_argument("--render-only", action="store_true", help="compute nothing; render the cache")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the Markdown file (PNGs go beside it)")
    p.add_argument("--no-cache", action="store_true", help="recompute the parts named")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_args(args) -> ReportConfig:
    lengths = tuple(args.lengths)
    return ReportConfig(n=args.n, retrieval_length=args.retrieval_length, lengths=lengths,
                        length_n=args.length_n, mc_n=args.mc_n, greedy_tokens=args.greedy_tokens,
                        repeats=args.repeats)


def check_lengths(cfg: ReportConfig, context: int) -> None:
    """Every retrieval length within the model's context, before any part builds a prompt."""
    for flag, n in [("--retrieval-length", cfg.retrieval_length)] + [("--lengths", n) for n in cfg.lengths]:
        if n < 1 or (context and n > context):
            raise ReportError(f"{flag} {n} exceeds the model's context of {context} tokens"
                              if n >= 1 else f"{flag} must be at least 1, got {n}")


def check_sizes(cfg: ReportConfig, parts) -> None:
    """Every part's item count within its data (GSM8K's test set, the retrieval task's distinct
    needles), before the model loads: one line saying how many items there are."""
    for part in parts:
        flag, n = (("--mc-n", cfg.mc_n) if part == "mc" else
                   ("--length-n", cfg.length_n) if part == "length" else ("--n", cfg.n))
        data = "gsm8k" if part in ("mc", "table3", "table4") else "retrieval"
        check_size(data, n, flag)


def parts_from_args(args) -> tuple[str, ...]:
    if args.render_only:
        return ()
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS and p != METHODS_PART]
    if bad:
        raise ReportError(f"unknown report part(s) {bad}; choose from {', '.join(PARTS)}, "
                          f"{METHODS_PART}")
    return parts


def command_line(args, cfg: ReportConfig) -> str:
    return (f"python -m pop_analysis report --model {args.model} --threads {args.threads or 'N'} "
            f"--n {cfg.n} --length-n {cfg.length_n} --mc-n {cfg.mc_n}")


def write_methods(args, lm, out: Path, compute: bool, bar) -> float | None:
    """The methods section (its own markers, after the model's tables); its wall time or None
    when nothing is stored."""
    if min(args.methods_n, args.methods_eval_n) < 2:
        raise ReportError("--methods-n and --methods-eval-n must be >= 2")
    mcfg = MethodsReportConfig(n=args.methods_n, eval_n=args.methods_eval_n)
    part = methods_part(lm, mcfg, compute, not args.no_cache, bar)
    if part is None:
        return None
    command = (f"python -m pop_analysis report --model {args.model} --parts {METHODS_PART} "
               f"--methods-n {mcfg.n} --methods-eval-n {mcfg.eval_n}")
    figs = out.with_suffix("") / slug(lm.name)
    lines = render_methods(lm.name, part, figs, f"{out.stem}/{figs.name}", command)
    out.write_text(place(out, f"{lm.name} {METHODS_PART}", lines, after=lm.name), encoding="utf-8")
    cmp = part["comparison"] or {}
    return round(sum(part["importance"]["seconds"].values()) + cmp.get("seconds", 0.0), 1)


def run(args) -> int:
    quiet_hf()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local task files only: nothing to fetch
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg, parts = config_from_args(args), parts_from_args(args)
    out = Path(args.out).expanduser()
    if out.suffix != ".md":
        raise ReportError(f"--out must name a .md file, got {out}")
    writable(str(out), "--out", make_parent=True)  # before any part runs
    check_sizes(cfg, parts)
    lm = load(args)
    check_lengths(cfg, lm.adapter.shape.max_positions)
    bar = None if args.quiet or args.json else terminal_bar
    results = collect(lm, cfg, [p for p in parts if p in PARTS], not args.no_cache, bar)
    for part, res in results.items():
        for note in (res or {}).get("notes") or []:
            print(f"note: {part}: {note}", file=sys.stderr)
    path = out
    if any(r is not None for r in results.values()):  # else the tables' section stays as it is
        path = write_report(results, cfg, lm.name, out, command_line(args, cfg))
    summary = {p: None if r is None else round(r.get("seconds", 0.0), 1) for p, r in results.items()}
    methods = write_methods(args, lm, out, METHODS_PART in parts, bar)
    if methods is not None or METHODS_PART in parts:
        summary[METHODS_PART] = methods
    if args.json:
        emit_json({"report": str(path), "seconds": summary})
    else:
        print(f"wrote {path}")
        for p, s in summary.items():
            print(f"  {p}: {'not computed yet' if s is None else f'{s:.0f} s'}")
    return 0
