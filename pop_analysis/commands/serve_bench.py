"""Load test a local vLLM server: full against POP, alternated, with the timing protocol's fields."""
from __future__ import annotations

from pop_analysis.commands._common import (
    MAX_TOKENS,
    SEED,
    Num,
    NumList,
    add_skip_args,
    emit_json,
)
from pop_analysis.commands._serving import add_engine_args, spec_from_args, stderr_progress
from pop_analysis.serving.loadgen import MAX_OUTPUT, MAX_PROMPTS, LoadSpec
from pop_analysis.serving.session import Serving
from pop_analysis.speed.timing import MAX_ROUNDS

MAX_RATE = 1e6  # requests per second given as a number (inf: all at once)
RATES = NumList(Num(float, 0.0, MAX_RATE, open_low=True), inf_ok=True)  # never NaN


def add_arguments(p) -> None:
    add_skip_args(p, default_ratio=0.33)
    add_engine_args(p)
    p.add_argument("--requests", type=Num(int, 1, MAX_PROMPTS), default=32,
                   help="requests per load test (default 32)")
    p.add_argument("--input-len", type=Num(int, 1, MAX_TOKENS), default=1024,
                   help="prompt tokens per request")
    p.add_argument("--output-len", type=Num(int, 2, MAX_OUTPUT), default=64,
                   help="generated tokens per request")
    p.add_argument("--request-rates", type=RATES, default="2,inf",
                   help="comma list of request rates per second (inf: all at once); one row each")
    p.add_argument("--max-concurrency", type=Num(int, 1, MAX_PROMPTS), default=None,
                   help="requests in flight at most")
    p.add_argument("--rounds", type=Num(int, 3, MAX_ROUNDS), default=3,
                   help="alternated rounds per rate (at least 3)")
    p.add_argument("--engines", choices=("one", "two"), default="one",
                   help="one: a POP engine switched to full and back at run time (default); "
                        "two: stock vLLM for full beside the POP engine")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--json", action="store_true", help="end stdout with one JSON object")


def run(args) -> int:
    specs = [LoadSpec(num_prompts=args.requests, input_len=args.input_len,
                      output_len=args.output_len, request_rate=r,
                      max_concurrency=args.max_concurrency, seed=args.seed).check(args.max_model_len)
             for r in args.request_rates]
    pop = spec_from_args(args)
    show = None if args.json else _line
    with Serving(pop, progress=stderr_progress("starting vLLM"), timeout_s=args.start_timeout,
                 engines=args.engines) as s:
        if not args.json:
            for name, info in s.engines_info().items():
                print(f"{name} engine ({info['serves']}): ready in {info['start_s']:.1f} s, {info['rss_mib']} MiB; "
                      f"command: {info['command']}")
        rows = s.bench(specs, rounds=args.rounds, progress=_bar,
                       on_row=show)
        out = {"model": pop.name, "variant": str(pop.setting.variant),
               "skip_layers": list(pop.setting.skip),
               "repair": pop.setting.repair, "engines": s.engines_info(), "rows": rows}
    if args.json:
        emit_json(out)
    return 0


def _bar(p) -> None:
    import sys

    sys.stderr.write(f"\r{p.done}/{p.total} {p.message:<70}")
    sys.stderr.flush()


def _line(r: dict) -> None:
    lo, hi = r["speedup_range"]
    rate = r["request_rate"] if r["request_rate"] is not None else "inf"
    flag = "" if r["timing_trustworthy"] else f"\n    NOT TRUSTWORTHY: {r['timing_note']}"
    print(f"\nrate {rate} req/s: TTFT median full {r['ttft_full_ms']:.0f} ms, {r['variant']} "
          f"{r['ttft_pop_ms']:.0f} ms (p90 {r['ttft_p90_full_ms']:.0f} / {r['ttft_p90_pop_ms']:.0f}); "
          f"speedup {r['speedup']:.2f}x [{lo:.2f}-{hi:.2f}, {r['timing_rounds']} rounds]; "
          f"TPOT {r['tpot_full_ms']:.1f} / {r['tpot_pop_ms']:.1f} ms; "
          f"throughput {r['throughput_full']:.1f} / {r['throughput_pop']:.1f} tok/s{flag}")
