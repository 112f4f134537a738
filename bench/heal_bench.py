"""Self-healing POP against plain POP and the full model (docs/healing.md).

Stages (each writes bench/raw/heal_bench/<stage>_<model>_<tokens>__<every parameter>__<UTC
start>.json, a new file per run, and prints progress; report reads each stage's newest):

    quality    64-token greedy agreement with the full model on few-shot GSM8K prompts of exactly
               --tokens tokens (built from the shared data, read by path): plain POP, eager
               healing and a budget of positions per step; n prompts, 95% intervals, the share of
               POP's gap to 100% that healing closes (paired)
    retrieval  the synthetic retrieval task (quality/retrieval.py) at --tokens: exact match of
               the code, full vs POP vs healing
    timing     the timing protocol's rounds (order rotated each round, judged by
               speed/timing.judge with its flags): TTFT of healing vs plain POP, TPOT during and
               after the healing window vs plain POP and full, time to the last token vs full
    report     markdown tables of everything measured

    nice -n 15 python bench/heal_bench.py quality --model smollm2-135m --tokens 512 --prompts 100
    python bench/heal_bench.py timing --model smollm2-135m --tokens 512 --rounds 5   # quiet machine
    python bench/heal_bench.py report
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.generate import SamplingConfig, encode, generate
from pop_analysis.engine.heal import Healer, heal_greedy, heal_prompt
from pop_analysis.engine.models import load_model
from pop_analysis.engine.pop import FirstStep, left_pad
from pop_analysis.engine.skipset import describe, resolve
from pop_analysis.quality.metrics import agreement
from pop_analysis.quality.retrieval import RetrievalConfig, retrieval_items
from pop_analysis.quality.stats import mean_ci, paired_delta, proportion_ci
from pop_analysis.speed.timing import Contention, TimingConfig, judge, other_cpu_seconds
from pop_vllm.healing import make
from pop_vllm.run_setting import RunSetting

from bench_results import RAW, RawFile, latest

ROOT = Path(__file__).resolve().parent.parent
OUT = RAW / "heal_bench"
_RUN: dict = {}  # what -> this run's raw output file
DATA = ROOT.parent / "shared" / "data"


def settings(args, skip) -> dict:
    """The runs compared: name -> RunSetting; --policies picks the healing ones."""
    pop = RunSetting(skip)
    heals = {"eager": make("eager", chunk=args.chunk),
             "budget": make("budget", chunk=args.chunk, budget_positions=args.budget)}
    return {"full": RunSetting.full(), "pop": pop,
            **{f"heal_{p}": pop.replace(heal=heals[p]) for p in args.policies.split(",")}}


def write(name: str, payload: dict, args) -> None:
    payload = {**payload, "threads": torch.get_num_threads(), "load": os.getloadavg()}
    if name not in _RUN:  # after every batch: this run's own file, rewritten
        _RUN[name] = RawFile("heal_bench", args, what=name)
    _RUN[name].write(payload)
    print(json.dumps({k: v for k, v in payload.items() if k != "per_item"})[:1500], flush=True)


def fewshot_prompts(lm, n: int, tokens: int) -> list[list[int]]:
    """n prompts of exactly `tokens` tokens: solved GSM8K train problems, then a test question
    (the start of the first example is cut to fit)."""
    train = [json.loads(x) for x in (DATA / "gsm8k_train.jsonl").read_text().splitlines()]
    tests = load_prompts(str(DATA / "gsm8k_test.jsonl"), field="question", limit=n).prompts
    out, j = [], 0
    for q in tests:
        text, ids = f"Question: {q}\nAnswer:", []
        while len(ids) < tokens:
            ex = train[j % len(train)]
            j += 1
            text = f"Question: {ex['question']}\nAnswer: {ex['answer']}\n\n" + text
            ids = encode(lm, text, raw=True)
        out.append(ids[-tokens:])
    return out


def greedy(lm, ids, mask, setting, n_new):
    first, healer = heal_prompt(lm.adapter, ids, setting, attention_mask=mask)
    toks = heal_greedy(lm.adapter, first, healer, n_new).tolist()
    return toks, (healer.report() if healer else None)


def shared_prefill(lm, ids, mask, runs, n_new) -> dict:
    """The POP runs of `runs` (settings of one skip set) from one pruned prefill (each on its own
    copy of the cache): the prefill is the same computation for plain POP and every healing
    policy."""
    a = lm.adapter
    pop = next(iter(runs.values()))
    first, _ = heal_prompt(a, ids, pop.replace(heal=make("eager")), attention_mask=mask)
    out = {}
    for name, setting in runs.items():
        heal, f = setting.heal, setting.first_skipped(a.n_layers)
        own = FirstStep(first.logits, a.fork_cache(first.cache, first.position + n_new),
                        first.position, first.attention_mask, first.trunk)
        healer = Healer(a, heal, own, f) if heal.active else None
        out[name] = (heal_greedy(a, own, healer, n_new).tolist(), healer and healer.report())
    return out


def batches(items, size):
    for i in range(0, len(items), size):
        yield i, items[i:i + size]


def quality(args, lm, skip) -> None:
    runs = settings(args, skip)
    prompts = fewshot_prompts(lm, args.prompts, args.tokens)
    outs = {k: [] for k in runs}
    horizons = {k: [] for k in runs}
    t0 = time.time()
    for i, group in batches(prompts, args.batch):
        ids = torch.tensor(group)  # (B, T): every prompt has the same length, no padding
        got = {"full": greedy(lm, ids, None, runs["full"], args.new)}
        got.update(shared_prefill(lm, ids, None, {k: v for k, v in runs.items() if k != "full"},
                                  args.new))
        for name, (toks, rep) in got.items():
            outs[name] += toks
            horizons[name] += [rep and rep["horizon_tokens"]] * len(group)
        print(f"[{time.time() - t0:.0f}s] {i + len(group)}/{len(prompts)} prompts", flush=True)
        if len(outs["full"]) >= 2:  # what is measured so far is kept, with its n
            write_quality(args, lm, skip, runs, outs, horizons, len(prompts))


def write_quality(args, lm, skip, runs, outs, horizons, planned: int) -> None:
    """Agreement of each run's greedy tokens with the full model's: mean and 95% interval, exact
    share, the paired difference to plain POP and the share of POP's gap to 100% it closes."""
    per = {k: [agreement(r, o).match_rate for r, o in zip(outs["full"], v)] for k, v in outs.items()}
    first_same = {k: [float(r[0] == o[0]) for r, o in zip(outs["full"], v)] for k, v in outs.items()}
    summary = {}
    for k in [k for k in runs if k != "full"]:
        est = mean_ci(per[k], bounds=(0.0, 1.0))
        summary[k] = {"agreement": est.value, "ci": est.ci, "n": est.n,
                      "exact": proportion_ci([a == 1.0 for a in per[k]]).__dict__,
                      "first_token_same": float(np.mean(first_same[k])),
                      "horizon_median": _median(horizons[k])}
        if k != "pop":
            d = paired_delta(per[k], per["pop"])
            gap = 1.0 - summary["pop"]["agreement"]
            summary[k]["delta_vs_pop"] = {"mean": d.value, "ci": d.ci}
            summary[k]["gap_closed"] = ({"mean": d.value / gap, "ci": [c / gap for c in d.ci]}
                                        if gap else None)
    write(f"quality_{lm.name}_{args.tokens}", {
        "model": lm.name, "tokens": args.tokens, "new_tokens": args.new, "skip": describe(skip),
        "runs": {k: {"variant": str(s.variant), "heal": s.heal.as_dict()} for k, s in runs.items()},
        "data": "GSM8K few-shot (train examples + a test question), cut to the last tokens",
        "planned_prompts": planned, "summary": summary,
        "per_item": {"agreement": per, "horizon": horizons}}, args)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def retrieval(args, lm, skip) -> None:
    runs = settings(args, skip)
    items = retrieval_items(lm, RetrievalConfig(n_items=args.prompts, length=args.tokens))
    hits = {k: [] for k in runs}
    t0 = time.time()
    for i, group in batches(items, args.batch):
        ids, mask = left_pad([list(it.prompt_ids) for it in group], device=lm.adapter.device)
        n_new = max(len(it.reference_ids) for it in group)
        for name, setting in runs.items():
            toks, _ = greedy(lm, ids, mask, setting, n_new)
            hits[name] += [t[:len(it.reference_ids)] == list(it.reference_ids) for t, it in zip(toks, group)]
        print(f"[{time.time() - t0:.0f}s] {i + len(group)}/{len(items)} items", flush=True)
    summary = {k: proportion_ci(v).__dict__ for k, v in hits.items()}
    for k in [k for k in runs if k != "full"]:
        d = paired_delta([float(x) for x in hits[k]], [float(x) for x in hits["full"]])
        summary[k]["delta_vs_full"] = {"mean": d.value, "ci": d.ci}
    write(f"retrieval_{lm.name}_{args.tokens}", {
        "model": lm.name, "tokens": args.tokens, "skip": describe(skip), "summary": summary,
        "runs": {k: {"variant": str(s.variant), "heal": s.heal.as_dict()} for k, s in runs.items()},
        "per_item": {k: [int(x) for x in v] for k, v in hits.items()}}, args)


def one_run(lm, ids, setting, n_new) -> dict:
    """One streamed generation: token arrival times (s) and the healing report."""
    cfg = SamplingConfig(max_new_tokens=n_new, stop_at_eos=False)
    times, rep = [], None
    for tok in generate(lm, ids, setting, cfg):
        times.append(tok.elapsed_s)
        rep = tok.heal
    return {"times": times, "heal": rep}


def phases(times, horizon) -> dict:
    """TTFT, mean TPOT of steps 1..h (the healing window) and h+1.. (after), time to last."""
    gaps = np.diff(times)  # gaps[k-1]: token k's step
    h = max(1, horizon or 1)
    return {"ttft": times[0], "during": float(np.mean(gaps[:h])), "after": float(np.mean(gaps[h:])),
            "last": times[-1]}


def timing(args, lm, skip) -> None:
    runs = settings(args, skip)
    ids = fewshot_prompts(lm, 1, args.tokens)[0]
    order = list(runs)
    for name in order:  # warm-up, untimed
        one_run(lm, ids, runs[name], 4)
    rounds = []
    before, t0 = other_cpu_seconds(), time.perf_counter()
    for r in range(args.rounds):
        got = {}
        for name in (order if r % 2 == 0 else order[::-1]):
            got[name] = one_run(lm, ids, runs[name], args.new)
        rounds.append(got)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} last {v['times'][-1]:.2f}s" for k, v in got.items()), flush=True)
    wall = time.perf_counter() - t0
    after = other_cpu_seconds()
    other = None if before is None or after is None else max(0.0, after - before) / wall
    cfg = TimingConfig()
    first = ["full" if r % 2 == 0 else "variant" for r in range(args.rounds)]
    out = {}
    for heal_name in [k for k in runs if k.startswith("heal_")]:
        hz = [rd[heal_name]["heal"]["horizon_tokens"] for rd in rounds]
        ph = {k: [phases(rd[k]["times"], hz[i]) for i, rd in enumerate(rounds)] for k in runs}

        def cmp(base, metric, ph=ph, heal_name=heal_name):
            t = judge([p[metric] for p in ph[base]], [p[metric] for p in ph[heal_name]], first, cfg,
                      Contention(other, torch.get_num_threads(), os.cpu_count() or 1))
            return {"ratio": t.speedup, "iqr": [t.low, t.high], "flag": t.note,
                    f"{base}_ms": float(np.median([p[metric] for p in ph[base]]) * 1e3),
                    "heal_ms": float(np.median([p[metric] for p in ph[heal_name]]) * 1e3)}

        out[heal_name] = {"heal": runs[heal_name].heal.as_dict(), "horizon": hz,
                          "ttft_vs_pop": cmp("pop", "ttft"),
                          "tpot_during_vs_pop": cmp("pop", "during"),
                          "tpot_during_vs_full": cmp("full", "during"),
                          "tpot_after_vs_pop": cmp("pop", "after"),
                          "tpot_after_vs_full": cmp("full", "after"),
                          "last_token_vs_full": cmp("full", "last")}
    write(f"timing_{lm.name}_{args.tokens}", {
        "model": lm.name, "tokens": args.tokens, "new_tokens": args.new, "skip": describe(skip),
        "rounds": args.rounds, "other_cores": other, "summary": out,
        "per_item": [{k: v["times"] for k, v in rd.items()} for rd in rounds]}, args)


def report(_args) -> None:
    for path in latest(OUT):
        d = json.loads(path.read_text())
        print(f"\n### {path.stem} (threads {d['threads']}, load {d['load'][0]:.1f})")
        for k, v in d["summary"].items():
            print(f"- {k}: {json.dumps(v)[:600]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=("quality", "retrieval", "timing", "report"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--prompts", type=int, default=100)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--budget", type=int, default=64, help="positions per step of the budget policy")
    p.add_argument("--ratio", type=float, default=0.33, help="skip the last share of layers")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--policies", default="eager,budget", help="healing policies compared")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.stage == "report":
        return report(args)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    skip = resolve(lm.adapter.n_layers, ratio=args.ratio)
    {"quality": quality, "retrieval": retrieval, "timing": timing}[args.stage](args, lm, skip)


if __name__ == "__main__":
    main()
