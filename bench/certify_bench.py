"""The certified choice's cost against today's uncertified choice, side by side (docs/benchmarks.md).

    python bench/certify_bench.py --model smollm2-135m --cert-samples 300

certified: experiments/certify.certify (the search on --selection-samples selection items, then
  fixed-sequence testing on --cert-samples certification items, lazily, --chunk sets per
  evaluation); uncertified: experiments/choose.choose (bisection and greedy refinement, every
  candidate measured on the same --cert-samples items, no timing of the chosen set). Both walk the
  tail's ranking (no importance run to time) for the same budget (ΔNLL bound 0.1 for choose; α 0.1,
  ε 0.1, δ 0.05 for the certificate), with no store. Timed through the timing protocol
  (speed/timing.py: a warm-up of both on --warmup-items items, then rounds with the order
  swapped; "speedup" = uncertified time / certified time, above 1 when the certified choice is
  faster). Prints one JSON object with the outcome of each and the conditions.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from pop_analysis.engine.models import load_model  # noqa: E402
from pop_analysis.experiments.certify import CertifyConfig, certify  # noqa: E402
from pop_analysis.experiments.choose import Budget, ChooseConfig, choose  # noqa: E402
from pop_analysis.importance.picks import tail_scores  # noqa: E402
from pop_analysis.quality.evalsets import load_eval_set  # noqa: E402
from pop_analysis.quality.items import EvalSet  # noqa: E402
from pop_analysis.quality.splits import make_splits  # noqa: E402
from pop_analysis.speed.timing import TimingConfig, measure, other_cpu_seconds_but_ours  # noqa: E402

from importance_bench import conditions, timing_fields  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--selection-samples", type=int, default=100)
    p.add_argument("--cert-samples", type=int, default=300)
    p.add_argument("--offset", type=int, default=600, help="first GSM8K test item used")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=1.0, help="timing budget beyond 3 rounds")
    p.add_argument("--warmup-items", type=int, default=8,
                   help="the untimed warm-up runs both on this many items of each split (a round "
                        "at full size takes minutes; the warm-up only has to run the code paths)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    L, a = lm.adapter.n_layers, args.offset
    splits = make_splits(("builtin", 8), ("gsm8k", a, args.selection_samples),
                         ("gsm8k", a + args.selection_samples, args.cert_samples))
    full = load_eval_set(lm, "gsm8k", a + args.selection_samples + args.cert_samples)
    cut = lambda its: [dataclasses.replace(it, reference_ids=it.reference_ids[:32]) for it in its]  # noqa: E731
    sel = cut(full.items[a:a + args.selection_samples])
    cer = cut(full.items[a + args.selection_samples:])
    ranking, out = tail_scores(L), {}

    def certified(s=sel, c=cer):
        out["certified"] = certify(lm, ranking, splits, CertifyConfig(method="tail"), items=(s, c))

    def uncertified(c=cer):
        same = EvalSet("gsm8k certification items", full.fingerprint, tuple(c), "gsm8k")
        out["uncertified"] = choose(lm, ranking, Budget(max_delta_nll=0.1),
                                    ChooseConfig(method="tail", n_samples=len(c), speed=False),
                                    evalset=same)

    w = args.warmup_items  # the warm-up: both code paths once, on a few items, untimed
    uncertified(cer[:w])
    certified(sel[:w], cer[:w])
    cpu0, t0 = other_cpu_seconds_but_ours(), time.perf_counter()
    t = measure(uncertified, certified, TimingConfig(budget_s=args.budget_s, warmup=0),
                on_round=lambda done, planned: print(f"[{time.perf_counter() - t0:.0f} s] round "
                                                      f"{done} of {planned}", flush=True))
    c, u = out["certified"], out["uncertified"]
    from bench_results import save

    save("certify_bench", args, {
        "model": args.model, "selection_items": len(sel), "certification_items": len(cer),
        "timing": timing_fields(t) | {"meaning": "uncertified s / certified s"},
        "certified": {"note": c.note, "sets_searched": sum(s["tried"] for s in c.sequence),
                      "sets_tested": sum(1 for s in c.sequence if s.get("tested")),
                      "seconds": c.seconds},
        "uncertified": {"note": u.note, "sets_measured": len(u.candidates)},
        "conditions": conditions(cpu0, t0)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
