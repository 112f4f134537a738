"""TTFT of POP against full inside one vLLM engine (the POP plugin, vLLM's CPU build).

Runs in the serving venv (scripts/install_vllm.sh builds it), on an otherwise quiet machine:

    .venv-vllm/bin/python bench/vllm_ttft_bench.py
    ... --lengths 512 2048 4096 --mode eager|compiled --threads 1 --rounds 5

One engine, one request at a time, prefix caching off, the whole prompt in one step. Full and POP
are the same engine switched at run time (worker method pop_set); POP Lab's timing protocol
(pop_analysis/speed/timing.py, numpy only, imported as is) alternates them: warm-up, rounds with
the order swapped, median of the per-round ratios with its IQR and flags. The switch happens
inside the timed call but its time is taken off the clock, so only llm.generate is timed.
  ttft    a prompt of N random token ids, max_tokens=1 (prefill + x_N's full step + sampling),
          wall clock of llm.generate
  forward the same requests timed by the worker's model-forward clock (worker method
          pop_forward_seconds): the prefill step's model time without the engine's scheduling,
          sampling and inter-process messages, which both variants pay alike
  decode  64 generated tokens after a 128-token prompt minus the same request with 1 token: the
          decode steps alone (never on the POP path, so the ratio should be 1.0)
Writes a new file under bench/raw/vllm_ttft_bench/, named by the parameters (printed too).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pop_vllm.engine_env import FORWARD_SECONDS, STATS, SWITCH
from pop_vllm.run_setting import RunSetting

ROOT = Path(__file__).resolve().parent.parent
SKIP = list(range(20, 30))


class SwitchClock:
    """perf_counter minus the time spent switching variants (kept out of the timed intervals)."""

    def __init__(self):
        self.excluded = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.excluded

    def exclude(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.excluded += time.perf_counter() - t0
        return out


def _prompt(length: int, seed: int, vocab: int = 49152) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(100, vocab, length).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--mode", choices=["eager", "compiled"], default="eager")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="fewest timed rounds per length")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed rounds per length")
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, _exit_on_term)

    from pop_vllm.engine_env import apply

    apply(ROOT / "cache", kv_cache_gib=2, threads=args.threads)
    from vllm import LLM, SamplingParams

    from pop_analysis.speed.timing import (
        Machine,
        TimingConfig,
        measure,
        other_cpu_seconds_but_ours,
    )
    from pop_vllm import overrides

    from bench_results import save

    longest = max(args.lengths + [192])
    t0 = time.perf_counter()
    llm = LLM(str(ROOT / "cache" / "models" / "smollm2-135m"), dtype="float32", seed=0,
              enforce_eager=args.mode == "eager", enable_prefix_caching=False,
              max_model_len=longest + 80, max_num_batched_tokens=longest + 80, max_num_seqs=4,
              hf_overrides=overrides("LlamaForCausalLM", RunSetting(SKIP)))
    start_s = time.perf_counter() - t0
    try:
        # the engine's worker and core are our child processes: their CPU is ours, not another's
        def timed(full, variant, cfg, clock, ideal=None):
            machine = Machine(clock=clock, probe=other_cpu_seconds_but_ours, threads=args.threads)
            return measure(full, variant, cfg, machine=machine, ideal=ideal)

        return _bench(args, llm, start_s, save, SamplingParams, TimingConfig, timed)
    finally:
        llm.llm_engine.engine_core.shutdown()


def _exit_on_term(*_):
    raise SystemExit(143)  # the finally above shuts the engine's processes down


def _flop_ideal(n: int) -> float:
    """POP's FLOP ideal for an n-token prefill of the model under SKIP (speed/flops.py)."""
    import json

    from pop_analysis.engine.adapter import Shape
    from pop_analysis.speed.flops import ideal_speedup

    c = json.loads((ROOT / "cache" / "models" / "smollm2-135m" / "config.json").read_text())
    shape = Shape(c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                  c["num_key_value_heads"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                  c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"])
    return ideal_speedup(shape, n, RunSetting(SKIP))


def _bench(args, llm, start_s, save, SamplingParams, TimingConfig, measure) -> int:
    clock = SwitchClock()
    cfg = TimingConfig(min_rounds=args.rounds, max_rounds=max(args.rounds, 15),
                       budget_s=args.budget, warmup=1)

    def gen(variant: str, ids, n_new: int) -> None:
        setting = RunSetting(SKIP, variant).as_config()
        clock.exclude(llm.collective_rpc, SWITCH, None, (setting,))
        llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=n_new, temperature=0.0,
                                                                 ignore_eos=True), use_tqdm=False)

    rows = []
    for n in args.lengths:
        ids = _prompt(n, seed=n)
        ideal = _flop_ideal(n)  # a ratio above it (beyond the protocol's margin) is flagged
        t = measure(lambda: gen("full", ids, 1), lambda: gen("pop", ids, 1), cfg, clock,
                    ideal=ideal)
        rows.append(dict(_row("ttft", n, t), flop_ideal=round(ideal, 4)))
        _print("ttft", n, t)
        t = measure(lambda: gen("full", ids, 1), lambda: gen("pop", ids, 1), cfg,
                    lambda: llm.collective_rpc(FORWARD_SECONDS)[0], ideal=ideal)
        rows.append(dict(_row("forward", n, t), flop_ideal=round(ideal, 4)))
        _print("forward", n, t)
    if not args.no_decode:
        ids = _prompt(128, seed=1)

        t = measure(lambda: _decode_only(clock, gen, "full", ids),
                    lambda: _decode_only(clock, gen, "pop", ids), cfg, clock)
        row = _row("decode", 128, t)
        row["decode_tok_s_full"] = round(64 / (t.full_median_ms / 1e3), 2)
        row["decode_tok_s_pop"] = round(64 / (t.variant_median_ms / 1e3), 2)
        rows.append(row)
        print(f"decode: {t.speedup:.3f}x [{t.low:.3f}, {t.high:.3f}] {row['decode_tok_s_full']} vs "
              f"{row['decode_tok_s_pop']} tok/s {t.note or ''}", flush=True)
    stats = llm.collective_rpc(STATS)[0]
    save("vllm_ttft_bench", args,
         {"mode": args.mode, "threads": args.threads, "skip": SKIP, "engine_start_s": round(start_s, 1),
          "rows": rows, "pop_stats": stats})
    return 0


def _decode_only(clock: SwitchClock, gen, variant: str, ids) -> None:
    """65 tokens timed, minus a 1-token run of the same request (added to the excluded time)."""
    t0 = clock()
    gen(variant, ids, 1)
    one = clock() - t0  # the switch inside gen is off the clock already
    gen(variant, ids, 65)
    clock.excluded += one


def _print(kind: str, n: int, t) -> None:
    print(f"{kind} {n}: {t.speedup:.3f}x [{t.low:.3f}, {t.high:.3f}] full {t.full_median_ms:.1f} ms "
          f"pop {t.variant_median_ms:.1f} ms, {t.rounds} rounds {t.note or ''}", flush=True)


def _row(kind: str, n: int, t) -> dict:
    return {"kind": kind, "tokens": n, "speedup": round(t.speedup, 4),
            "full_ms": round(t.full_median_ms, 2), "pop_ms": round(t.variant_median_ms, 2),
            "ratios": [round(r, 4) for r in t.ratios], **t.fields(),
            "other_cores": None if t.other_cores is None else round(t.other_cores, 2)}


if __name__ == "__main__":
    sys.exit(main())
