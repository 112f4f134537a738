"""Compute (or resume) a per-item loss table under docs/reproduction/raw/: the full model's and
each skip set's continuation NLL on GSM8K test items. Long: run it niced, in the background.

  nice -n 15 .venv/bin/python scripts/item_losses.py --model smollm2-135m --pool 600 \\
      --sets tail:1-20 --out docs/reproduction/raw/smollm2-135m/pool.json
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pop_analysis.engine.models import load_model  # noqa: E402
from pop_analysis.engine.skipset import parse_layers  # noqa: E402
from pop_analysis.experiments.item_losses import compute_table  # noqa: E402
from pop_analysis.quality.evalsets import load_eval_set  # noqa: E402


def tail_sets(spec: str, n_layers: int) -> list[tuple[int, ...]]:
    lo, hi = (int(x) for x in spec.split("-"))
    return [tuple(range(n_layers - k, n_layers)) for k in range(lo, hi + 1)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--pool", type=int, default=600, help="GSM8K test items 0..pool-1")
    p.add_argument("--sets", default="", help="tail:LO-HI: the tail blocks of LO..HI layers")
    p.add_argument("--layers", default="", help="more sets, ';'-separated layer lists (3,14,17-29)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--chunk", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    L = lm.adapter.n_layers
    sets = tail_sets(args.sets.split(":", 1)[1], L) if args.sets.startswith("tail:") else []
    sets += [parse_layers(x, L) for x in args.layers.split(";") if x.strip()]
    es = load_eval_set(lm, "gsm8k", args.pool)
    items = [dataclasses.replace(it, reference_ids=it.reference_ids[:args.answer_tokens])
             for it in es.items]
    log = lambda line: print(line, flush=True)  # noqa: E731
    log(f"{args.model}: {len(items)} items, {len(sets)} sets -> {args.out}")
    compute_table(lm, items, sets, args.out, f"gsm8k items 0-{args.pool - 1}",
                  args.answer_tokens, args.chunk, log)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
