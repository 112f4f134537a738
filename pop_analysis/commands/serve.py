"""Serve POP through a local vLLM OpenAI-compatible server until Ctrl-C."""
from __future__ import annotations

from dataclasses import replace

from pop_analysis.commands import _disagg
from pop_analysis.commands._common import Num, add_skip_args, emit_json
from pop_analysis.commands._serving import add_engine_args, spec_from_args, stderr_progress
from pop_analysis.engine.skipset import describe
from pop_analysis.serving.server import Engine


def add_arguments(p) -> None:
    add_skip_args(p, default_ratio=0.33)
    add_engine_args(p)
    p.add_argument("--port", type=Num(int, 0, 65535), default=8000,
                   help="port on 127.0.0.1 (0: any free one)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON line (url, command, start-up) once the engine is ready")
    p.add_argument("--prefix-caching", action="store_true",
                   help="vLLM's prefix cache: POP's block hashes carry its settings and the "
                        "pruned/full path, so it stays exact (default off)")
    _disagg.add_arguments(p)


def run(args) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in 0..65535, got {args.port}")
    spec = replace(spec_from_args(args, port=args.port), prefix_caching=args.prefix_caching)
    if args.disaggregated:
        return _disagg.run(args, spec)
    if args.prefill_int8 is not None:
        raise ValueError("--prefill-int8 needs --disaggregated: the prefill instance runs the int8 "
                         "copy, the decode instance the fp32 model")
    engine = Engine(spec)
    what = ("full model" if not spec.pop else
            f"{spec.setting.variant}, skip {describe(spec.setting.skip)}")
    try:
        engine.start(progress=stderr_progress(f"starting vLLM ({what})"), timeout_s=args.start_timeout)
        info = {"url": f"{engine.url}/v1", "model": spec.name,
                "variant": str(spec.setting.variant), "skip_layers": list(spec.setting.skip),
                "repair": spec.setting.repair,
                "command": engine.command_line,
                "start_s": round(engine.start_s, 2), "rss_mib": round(engine.rss_bytes() / 2**20),
                "log": str(engine.log_path)}
        if args.json:
            emit_json(info)
        else:
            print(f"serving {spec.name} ({what}) at {info['url']} "
                  f"(ready in {info['start_s']:.1f} s, {info['rss_mib']} MiB resident)")
            print(f"command: {engine.command_line}")
            print(f"log: {engine.log_path}\nCtrl-C stops it.", flush=True)
        engine.proc.wait()  # returns only when the engine ends on its own
        engine.check()
        return 0
    except KeyboardInterrupt:
        print("\nstopping the engine ...", flush=True)
        return 0
    finally:
        engine.stop()
