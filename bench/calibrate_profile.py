"""Where calibration's seconds go: wall time per phase of the current one-pass path (fisher.py)
and of the previous algorithm (calibrate_previous.py), on the same prompts, plus the per-layer cost
of one batched decode step split into its matmuls, its other aten ops and Python.

    python bench/calibrate_profile.py --dataset wizardlm --prompts 16 --max-new-tokens 64

Phases are timed by wrapping the functions that do them (exclusive time: a wrapped call inside
another is counted once, in the inner phase); "other" is the rest of the run's wall time (packing,
hook setup, result assembly). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibrate_previous  # noqa: E402
import torch  # noqa: E402
from calibrate_bench import conditions, prompt_set  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from pop_analysis.engine.models import load_model  # noqa: E402
from pop_analysis.importance import fisher  # noqa: E402
from pop_analysis.importance.calibrate import CalibrationConfig, calibrate, encode_prompts
from pop_analysis.importance.fewrows import few_rows  # noqa: E402


class Phases:
    """Exclusive wall time per phase name, from wrapped functions (restored by undo())."""

    def __init__(self):
        self.t: dict[str, float] = {}
        self.stack: list[float] = []  # time spent in wrapped children of each open call
        self.undo_list = []

    def wrap(self, obj, name: str, key) -> None:
        f = getattr(obj, name)

        def timed(*a, **kw):
            k = key(a, kw)  # before the call: a forward fills the cache it is keyed on
            self.stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                inner = self.stack.pop()
                self.t[k] = self.t.get(k, 0.0) + dt - inner
                if self.stack:
                    self.stack[-1] += dt
        own = name in vars(obj)  # an instance's bound method is not its own attribute
        setattr(obj, name, timed)
        self.undo_list.append((obj, name, f, own))

    def undo(self) -> None:
        for obj, name, f, own in reversed(self.undo_list):
            if own:
                setattr(obj, name, f)
            else:
                delattr(obj, name)


def forward_key(a, kw) -> str:
    ids = a[0]
    if ids.shape[1] == 1:
        return "sampling steps: decoder layers"
    if not torch.is_grad_enabled():
        return "prompt forward, no autograd (sampling)"
    cache = a[3] if len(a) > 3 else kw.get("cache")
    if cache is None:
        return "teacher-forced forward [prompt ; response], gated (autograd)"
    if cache.get_seq_length():
        return "response forward, gated (autograd)"
    return "prompt forward, gated (autograd)"


def instrument(lm) -> Phases:
    ad, p = lm.adapter, Phases()
    p.wrap(ad, "forward_padded", forward_key)
    p.wrap(ad, "head", lambda a, kw: "lm_head (loss positions, autograd)" if torch.is_grad_enabled()
           else "sampling steps: lm_head")
    p.wrap(ad, "head_vjp", lambda a, kw: "dL/dh through lm_head weight")
    p.wrap(ad, "fork_cache", lambda a, kw: "cache fork")
    p.wrap(fisher, "_pick_rows", lambda a, kw: "sampling steps: picks (top-p, draw)")
    p.wrap(calibrate_previous, "pick", lambda a, kw: "sampling steps: picks (top-p, draw)")
    p.wrap(fisher._LossTerms, "add", lambda a, kw: "loss terms from sampling logits")
    for obj in (torch.autograd, torch.Tensor):
        p.wrap(obj, "backward", lambda a, kw: "backward to the gates")
    return p


def phase_profile(lm, run) -> dict:
    p = instrument(lm)
    try:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
    finally:
        p.undo()
    out = {k: round(v, 3) for k, v in sorted(p.t.items(), key=lambda kv: -kv[1])}
    out["other (packing, hooks, Python between phases)"] = round(wall - sum(p.t.values()), 3)
    out["total"] = round(wall, 3)
    return out


def decode_step_split(lm, rows: int, context: int, steps: int = 8) -> dict:
    """Per layer and step of a batched decode step (rows x 1 token, `context` cached): wall time,
    aten ops' self time (torch.profiler; matmuls apart) and the rest (Python, dispatch)."""
    ad = lm.adapter
    ids = torch.randint(100, 1000, (rows, context))
    mask = torch.ones(rows, context, dtype=torch.long)
    with torch.no_grad(), few_rows(lm.model):
        cache = ad.fork_cache(_filled(ad, ids, mask), context + steps + 1)
        tok = ids[:, -1:]

        def step(i):
            m = torch.ones(rows, context + i + 1, dtype=torch.long)
            return ad.forward_padded(tok, m, torch.full((rows, 1), context + i), cache)
        step(0)
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            step(i)
        wall = (time.perf_counter() - t0) / steps / ad.n_layers
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps + 1, 2 * steps + 1):
                step(i)
    ev = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    per = 1e-6 / steps / ad.n_layers  # profiler microseconds -> seconds per layer and step
    mm = sum(e.self_cpu_time_total for e in ev if e.key in ("aten::mm", "aten::addmm")) * per
    aten = sum(e.self_cpu_time_total for e in ev) * per
    return {"rows": rows, "context": context, "layer_step_ms": round(wall * 1e3, 3),
            "matmul_ms": round(mm * 1e3, 3), "other_aten_ms": round((aten - mm) * 1e3, 3),
            "python_and_dispatch_ms": round(max(0.0, wall - aten) * 1e3, 3)}


def _filled(ad, ids, mask):
    cache = ad.new_cache()
    ad.forward_padded(ids, mask, None, cache)
    return cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="wizardlm")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(device="cpu")
    cfg = CalibrationConfig(n_samples=args.prompts, max_new_tokens=args.max_new_tokens,
                            seed=args.seed, batch_size=args.batch_size)
    prompts = prompt_set(args.dataset, args.prompts)
    warm = CalibrationConfig(n_samples=2, max_new_tokens=4, seed=args.seed)
    calibrate(lm, prompts, warm)
    calibrate_previous.calibrate_previous(lm, encode_prompts(lm, prompts, warm), warm)
    row = {"dataset": prompts.name, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
           "batch_size": args.batch_size, "load_avg_before": round(os.getloadavg()[0], 2)}
    row["new"] = phase_profile(lm, lambda: calibrate(lm, prompts, cfg))
    row["old"] = phase_profile(lm, lambda: calibrate_previous.calibrate_previous(
        lm, encode_prompts(lm, prompts, cfg), cfg))
    row["decode_step_per_layer"] = decode_step_split(lm, min(args.batch_size, args.prompts), 120)
    row.update(conditions())
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
