"""Load tests of POP beyond one engine, through vLLM's own benchmark code and POP Lab's timing
protocol (pop_analysis.serving.bench: warm-up, rounds with the order swapped, median of the
per-round ratios with its IQR and flags). Run it from the project venv on an otherwise quiet
machine:

    .venv/bin/python bench/disagg_bench.py pd
    ... prefill | prefix   [--rounds 3 --requests 24 ...]

pd       colocated against disaggregated at equal cores, both POP (skip 20-29): one engine on
         cores 0-1 (2 threads) against a prefill instance on core 0 and a decode instance on
         core 1 (1 thread each) joined by the POP KV connector and vLLM's router. A mixed load
         (Poisson arrivals, prompts and generation overlapping). Ratios are colocated /
         disaggregated: above 1, disaggregation is faster.
prefill  a POP prefill instance against a full one, both the producer side of the connector on
         core 0 (1 thread), each request a hand-off (kv_transfer_params do_remote_decode, its K/V
         written to the folder) of a long prompt, all at once; 2 generated tokens (the load
         generator needs 2 for its TPOT). The throughput ratio is POP / full prompt throughput.
prefix   multi-turn chats (GSM8K questions with their reference answers as the assistant's
         turns; turn t's prompt is the conversation so far) on a POP engine with prefix caching
         on against one with it off, cores 0-1; every run gets fresh conversations (the same
         ones on both sides), so no run hits an earlier run's cache. Ratios are off / on.
Writes a new file under bench/raw/disagg_bench/, named by the part and every parameter (its
summary printed): a 4-turn run never replaces the 6-turn one.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import urllib.request
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = tuple(range(20, 30))
GSM8K = ROOT.parent / "shared" / "data" / "gsm8k_train.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["pd", "prefill", "prefix"])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (inf: at once)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6, help="prefix: turns per conversation")
    ap.add_argument("--data", default=str(GSM8K), help="prefix: GSM8K-style JSONL")
    ap.add_argument("--kv-dir", default="/dev/shm/poplab-kv-bench",
                    help="pd: the connector's storage root (memory by default)")
    args = ap.parse_args(argv)
    from bench_results import save

    row = PARTS[args.part](args)
    summary = {k: v for k, v in row.items() if not k.startswith("requests_")}
    print(json.dumps(summary, indent=1))
    save("disagg_bench", args, row, what=args.part, show=False)
    return 0


def _spec(args, **kw):
    from pop_analysis.serving.spec import spec_for
    from pop_vllm.run_setting import RunSetting

    return spec_for(args.model, RunSetting(SKIP), max_model_len=2048, **kw)


def _measure(args, sides, spec_load, names, pids, tokenizer) -> dict:
    """serve_bench over the two Targets, the row's full/pop keys renamed to `names`."""
    from pop_analysis.serving.bench import Client, serve_bench
    from pop_analysis.serving.loadgen import LoadGenerator
    from pop_analysis.store.paths import cache_dir

    with LoadGenerator(cache_dir() / "serving" / "disagg_loadgen.log") as gen:
        client = Client(gen, args.model, tokenizer, lambda: pids() + [gen.proc.pid])
        (row,) = serve_bench(*sides, client, [spec_load], rounds=args.rounds)
    rename = {"full": names[0], "pop": names[1]}
    return {_renamed(k, rename): v for k, v in row.items()}


def _renamed(key: str, rename: dict) -> str:
    for old, new in rename.items():
        key = key.replace(f"_{old}_", f"_{new}_")
        if key.endswith(f"_{old}"):
            key = key[: -len(old)] + new
    return key


def part_pd(args) -> dict:
    from pop_analysis.serving import disagg
    from pop_analysis.serving.bench import Target
    from pop_analysis.serving.loadgen import LoadSpec
    from pop_analysis.serving.server import Engine

    base = _spec(args)
    colocated = Engine(replace(base, cpus=(0, 1), threads=2,
                               extra_args=("--block-size", str(disagg.BLOCK_SIZE))))
    split = disagg.Disaggregated(disagg.plan(base, "pop", (0,), (1,), kv_root=args.kv_dir))
    try:
        colocated.start()
        split.start()
        load = LoadSpec(args.requests, args.input_len, args.output_len, args.rate)
        sides = (Target("colocated", colocated.url, check=colocated.check),
                 Target("disaggregated", split.url, check=split.check))
        row = _measure(args, sides, load, ("colocated", "disaggregated"),
                       lambda: colocated.pids() + split.pids(), base.model_dir)
    finally:
        split.stop()
        colocated.stop()
    shutil.rmtree(args.kv_dir, ignore_errors=True)
    return {"part": "pd", "load": load.describe(), "cores": "colocated 0-1; prefill 0, decode 1",
            "kv_dir": args.kv_dir, **row}


def part_prefill(args) -> dict:
    from pop_analysis.serving import disagg
    from pop_analysis.serving.bench import Target
    from pop_analysis.serving.loadgen import LoadSpec
    from pop_analysis.serving.server import Engine
    from pop_vllm.run_setting import RunSetting

    root = Path(tempfile.mkdtemp(prefix="poplab-kv-"))
    base = _spec(args)
    def prefill(variant):  # the producer side of a topology, alone on core 0
        spec = replace(base, setting=RunSetting(SKIP) if variant == "pop" else RunSetting.full())
        return Engine(disagg.plan(spec, "pop", (0,), (1,), kv_root=root).prefill)
    engines = {v: prefill(v) for v in ("full", "pop")}
    try:
        for e in engines.values():
            e.start()
        load = LoadSpec(args.requests, args.input_len, 2, math.inf,
                        extra_body=json.dumps({"kv_transfer_params": {"do_remote_decode": True}}))

        def empty():  # no decode instance takes the files: drop them between runs
            for f in root.rglob("*.safetensors"):
                f.unlink(missing_ok=True)
        sides = tuple(Target(v, e.url, before=empty, check=e.check) for v, e in engines.items())
        row = _measure(args, sides, load, ("full", "pop"),
                       lambda: [p for e in engines.values() for p in e.pids()], base.model_dir)
    finally:
        for e in engines.values():
            e.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"part": "prefill", "load": load.describe() + ", each a K/V hand-off",
            "cores": "each prefill instance on core 0, 1 thread",
            "prompt_throughput_ratio": row["throughput_ratio"], **row}


def conversations(path: str, turns: int, n: int, start: int) -> list[str]:
    """n chats of `turns` turns from GSM8K rows start.. (questions, reference answers as the
    assistant's turns), as the prompts of each turn: all first turns, then all second ones ..."""
    rows = [json.loads(ln) for ln in open(path)][start: start + n * turns]
    chats = [rows[i * turns:(i + 1) * turns] for i in range(n)]
    prompts = []
    for t in range(turns):
        for chat in chats:
            history = "".join(f"User: {r['question']}\nAssistant: {r['answer']}\n"
                              for r in chat[:t])
            prompts.append(f"{history}User: {chat[t]['question']}\nAssistant:")
    return prompts


class Chats:
    """Per side, each run's fresh conversations written to the side's dataset file, and the
    engine's prefix-cache counters read after it."""

    def __init__(self, args, path: Path, url: str):
        self.args, self.url, self.runs, self.path = args, url, 0, path
        self.n = math.ceil(args.requests / args.turns)
        self.hits = self.queries = 0.0

    def before(self) -> None:
        turns = self.args.turns
        prompts = conversations(self.args.data, turns, self.n, self.runs * self.n * turns)
        self.path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        self.runs += 1
        self.start = self.counters()

    def after(self) -> None:
        hits, queries = self.counters()
        self.hits += hits - self.start[0]
        self.queries += queries - self.start[1]

    def counters(self) -> tuple[float, float]:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
            text = r.read().decode()

        def total(name):
            return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                       if ln.startswith(name))
        return total("vllm:prefix_cache_hits_total"), total("vllm:prefix_cache_queries_total")


def part_prefix(args) -> dict:
    from pop_analysis.serving.bench import Target
    from pop_analysis.serving.loadgen import LoadSpec
    from pop_analysis.serving.server import Engine

    folder = Path(tempfile.mkdtemp(prefix="poplab-chats-"))
    base = replace(_spec(args), cpus=(0, 1), threads=2, extra_args=("--block-size", "32"))
    engines = {"off": Engine(base), "on": Engine(replace(base, prefix_caching=True))}
    try:
        for e in engines.values():
            e.start()
        dataset = folder / "chats.jsonl"  # run k of either side writes the same chats into it
        chats = {s: Chats(args, dataset, e.url) for s, e in engines.items()}

        def target(side):
            def check():
                engines[side].check()
                chats[side].after()
            return Target(side, engines[side].url, before=chats[side].before, check=check)
        n = math.ceil(args.requests / args.turns) * args.turns
        load = LoadSpec(n, 0, args.output_len, args.rate, dataset=str(dataset))
        row = _measure(args, (target("off"), target("on")), load, ("off", "on"),
                       lambda: [p for e in engines.values() for p in e.pids()], base.model_dir)
    finally:
        for e in engines.values():
            e.stop()
        shutil.rmtree(folder, ignore_errors=True)
    on = chats["on"]
    return {"part": "prefix", "cores": "each engine on 0-1",
            "load": f"{n} requests: {n // args.turns} chats x {args.turns} turns, "
                    f"{args.output_len} output tokens, {args.rate:g} req/s",
            "hit_rate_on": round(on.hits / max(on.queries, 1), 4), "hit_tokens_on": on.hits,
            "query_tokens_on": on.queries, **row}


PARTS = {"pd": part_pd, "prefill": part_prefill, "prefix": part_prefix}

if __name__ == "__main__":
    sys.exit(main())
