"""Write docs/reproduction/raw/<model>/methods.json from a published report section: the rows of
its ΔNLL tables and the paired comparisons of its verdict lines (the per-item outputs of those
runs were not stored), plus per-item NLL recomputed for the sets a loss table holds.

  .venv/bin/python scripts/methods_raw.py --model smollm2-135m --report-commit 1f549e2 \\
      --pool docs/reproduction/raw/smollm2-135m/pool.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from pop_analysis.experiments.item_losses import load_table
from pop_analysis.experiments.methods_raw import check_raw, parse_paired, parse_tables

N_ITEMS = 100  # the comparison's held-out items: GSM8K test items 0-99


def section(md: str, model: str) -> str:
    start = f"<!-- report {model} methods -->"
    return md.split(start, 1)[1].split(f"<!-- /report {model} methods -->", 1)[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--report-commit", required=True, help="the commit whose report is transcribed")
    p.add_argument("--pool", type=Path, default=None, help="a loss table over GSM8K items 0..")
    args = p.parse_args()
    md = subprocess.run(["git", "show", f"{args.report_commit}:docs/reproduction.md"],
                        check=True, capture_output=True, text=True).stdout
    sec = section(md, args.model)
    rows = parse_tables(sec)
    raw = {"model": args.model, "data": "gsm8k test items 0-99, answers cut to 32 tokens",
           "n": N_ITEMS, "source": f"the ΔNLL tables and verdict lines of docs/reproduction.md at "
           f"{args.report_commit} (that run's per-item outputs were not stored)",
           "rows": rows, "paired": parse_paired(sec, rows)}
    if args.pool:
        t = load_table(args.pool)
        if any(v is None for v in t.full[:N_ITEMS]):
            sys.exit(f"error: {args.pool} has fewer than {N_ITEMS} items computed")
        sets = {r["set"] for r in rows if r.get("set")}
        from pop_analysis.engine.skipset import describe

        raw["item_nll"] = {"full": list(t.full[:N_ITEMS]),
                           **{describe(s): list(t.nll[describe(s)][:N_ITEMS]) for s in t.sets
                              if describe(s) in sets}}
        raw["item_nll_source"] = f"recomputed: {args.pool} (items 0-{N_ITEMS - 1})"
    check_raw(raw)
    out = Path("docs/reproduction/raw") / args.model / "methods.json"
    out.write_text(json.dumps(raw, indent=1) + "\n")
    print(f"{out}: {len(rows)} rows, {len(raw['paired'])} paired comparisons, "
          f"{len(raw.get('item_nll', {})) - 1 if 'item_nll' in raw else 0} sets recomputed per item")
    return 0


if __name__ == "__main__":
    sys.exit(main())
