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

from pop_analysis.experiments.certify_report import MODELS, RAW, markdown, plot, run
from pop_analysis.experiments.item_losses import complete, load_table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--selection", type=int, default=0, help="items (0: a sixth of the pool)")
    p.add_argument("--cert", type=int, default=0, help="items (0: half of the pool)")
    p.add_argument("--splits", type=int, default=1000)
    p.add_argument("--name", default="certify_simulation", help="the output files' name")
    p.add_argument("--plot", type=Path, default=Path("docs/img/certify_simulation.png"))
    p.add_argument("--partial", action="store_true",
                   help="use the items computed so far when a pool is not complete")
    args = p.parse_args()
    for model in MODELS:
        if not complete(load_table(RAW / model / "pool.json")) and not args.partial:
            sys.exit(f"error: {model}'s pool is not complete yet (--partial uses what is done)")
    out = run(args.alpha, args.epsilon, args.delta, args.splits, RAW, args.selection, args.cert)
    (RAW / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out["models"], args.plot, args.alpha, args.delta)
    lines = markdown(out, "img/" + args.plot.name)
    (RAW / f"{args.name}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
