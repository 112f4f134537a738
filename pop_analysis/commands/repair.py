"""Fit or list closed-form K/V repairs of the skipped layers (the pop_repair variant)."""
from __future__ import annotations

import time

from pop_analysis.commands._common import (
    COUNT,
    TOKENS,
    add_model_args,
    add_skip_args,
    emit_json,
    load,
    quiet_hf,
    skip_from_args,
)
from pop_analysis.data.prompts import BUILTIN_NAME
from pop_analysis.engine.skipset import describe
from pop_analysis.progress import terminal_bar
from pop_analysis.repair.fit import RepairConfig, check_data
from pop_analysis.repair.store import fit_and_store, listing, memory


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser("fit", help="fit (or reuse) a repair for a skip set, with progress")
    add_model_args(f)
    add_skip_args(f, default_ratio=0.33)
    d = RepairConfig()
    f.add_argument("--data", default=BUILTIN_NAME,
                   help="calibration prompts: builtin, a .jsonl/.json/.csv/.parquet/.txt file or "
                        "hf:NAME; with --answers also gsm8k_train")
    f.add_argument("--field", default=None, help="prompt field of a file (default: detected)")
    f.add_argument("--samples", type=COUNT, default=d.n_samples, help="calibration prompts")
    f.add_argument("--answers", action="store_true",
                   help="append each record's reference answer (e.g. GSM8K's) to its prompt")
    f.add_argument("--raw", action="store_true", help="no chat template")
    f.add_argument("--max-tokens", type=TOKENS, default=d.max_tokens,
                   help="distinct calibration tokens used at most")
    f.add_argument("--unweighted", action="store_true",
                   help="count rows shared by several prompts (a common system prompt) once")
    f.add_argument("--no-cache", action="store_true", help="fit again even when stored")
    ls = sub.add_parser("list", help="list stored repairs")
    ls.add_argument("--json", action="store_true", help="end stdout with one JSON object")


def run(args) -> int:
    quiet_hf()
    return _fit(args) if args.action == "fit" else _list(args)


def _fit(args) -> int:
    cfg = RepairConfig(data=args.data, field=args.field, n_samples=args.samples,
                       answers=args.answers, raw=args.raw, max_tokens=args.max_tokens,
                       weighted=not args.unweighted)
    check_data(cfg)  # a size beyond the data: one line before the model loads
    lm = load(args)
    skip = skip_from_args(args, lm.adapter.n_layers)
    t0 = time.perf_counter()
    rep, stored = fit_and_store(lm, skip, cfg, None if args.json else terminal_bar,
                                use_cache=not args.no_cache)
    out = {"key": rep.key, "stored": stored, "model": lm.name, "skip_layers": list(rep.skip),
           "data": rep.info["data"], "n_tokens": rep.info["n_tokens"],
           "seconds": rep.info["seconds"], "wall_s": time.perf_counter() - t0,
           "threads": rep.info.get("threads"), "fit": rep.info["fit"], **memory(lm, rep)}
    if args.json:
        emit_json(out)
    else:
        print(report(out))
    return 0


def report(out: dict) -> str:
    """Per-layer ridge strength and R^2 of plain POP's projection vs the fitted map."""
    src = "stored" if out["stored"] else f"fitted in {out['seconds']:.1f} s"
    lines = [f"repair {out['key']} ({src}): {out['model']}, skip {describe(out['skip_layers'])}, "
             f"{out['n_tokens']} distinct tokens of {out['data']['name']}",
             f"{'layer':>5} {'K R2 pop':>9} {'K R2 fit':>9} {'V R2 pop':>9} {'V R2 fit':>9} "
             f"{'alpha K':>9} {'alpha V':>9}"]
    for layer, s in out["fit"].items():
        cells = [s["k_r2_pop"], s["k_r2_loo"], s["v_r2_pop"], s["v_r2_loo"], s["k_alpha"],
                 s["v_alpha"]]
        lines.append(f"{layer:>5} " + " ".join(_num(x) for x in cells))
    lines.append("R2 fit is leave-one-out on the calibration tokens; the first skipped layer keeps "
                 "its own projection (exact there)")
    lines.append(f"extra projections: {out['repair_bytes'] / 2**20:.2f} MiB beside the model's "
                 f"{out['model_bytes'] / 2**20:.1f} MiB ({100 * out['share']:.2f}%)")
    return "\n".join(lines)


def _num(x) -> str:
    return f"{'-':>9}" if x is None or x != x else f"{x:>9.4g}"


def _list(args) -> int:
    rows = listing()
    if args.json:
        emit_json({"repairs": rows})
        return 0
    if not rows:
        print("no stored repairs (python -m pop_analysis repair fit ...)")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["saved_at"]))
        print(f"{r['key']}  {r['model']}  skip {describe(r['skip'])}  {r['data']}  "
              f"{r['n_tokens']} tokens  {r['repair_bytes'] / 2**20:.1f} MiB  {when}")
    return 0
