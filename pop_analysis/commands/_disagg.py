"""`serve --disaggregated`: a prefill instance, a decode instance and the proxy joining them."""
from __future__ import annotations

import time

from pop_analysis.commands._common import Num, core_list, emit_json
from pop_analysis.commands._serving import stderr_progress
from pop_analysis.serving import disagg

POLL_S = 1.0  # how soon a dead member ends the topology


def add_arguments(p) -> None:
    g = p.add_argument_group("disaggregated prefill and decode (--disaggregated)")
    g.add_argument("--disaggregated", action="store_true",
                   help="serve through a prefill instance and a decode instance joined by a KV "
                        "connector and vLLM's router, each instance pinned to its own cores")
    g.add_argument("--decode", default="pop", choices=disagg.DECODE_SIDES,
                   help="the decode instance: pop (the prefill's settings, default) or full "
                        "(stock vLLM)")
    g.add_argument("--prefill-cpus", type=core_list(), help="cores of the prefill instance, e.g. 0 "
                                                            "or 0-3 (default: the first half)")
    g.add_argument("--decode-cpus", type=core_list(),
                   help="cores of the decode instance (default: the second half)")
    g.add_argument("--block-size", type=Num(int, 32, 1 << 16), default=disagg.BLOCK_SIZE,
                   help=f"KV cache block size of both instances (multiple of 32, default "
                        f"{disagg.BLOCK_SIZE})")
    g.add_argument("--prefill-int8", metavar="LAYERS",
                   help="the prefill instance runs these layers' Linears in int8 (its own int8 "
                        "copy of the model, written once under cache/models/int8/), the decode "
                        "instance the fp32 model: 'kept' (every layer it does not skip) or a "
                        "list like 0-19")
    g.add_argument("--kv-dir", help="the connector's storage root (default cache/kv_transfer; "
                                    "/dev/shm keeps it in memory)")


def int8_layers(text: str | None):
    """--prefill-int8: () without it, "kept", or a layer list (checked against the model later)."""
    if text is None:
        return ()
    if text.strip() == disagg.KEPT:
        return disagg.KEPT
    from pop_analysis.engine.skipset import parse_layers

    return parse_layers(text)


def run(args, spec) -> int:
    """Start the topology, print it and the exact commands, serve until Ctrl-C or a death."""
    topo = disagg.plan(spec, args.decode, args.prefill_cpus, args.decode_cpus, args.block_size,
                       args.kv_dir, proxy_port=args.port, prefill_int8=int8_layers(args.prefill_int8))
    running = disagg.Disaggregated(topo)
    try:
        running.start(progress=stderr_progress("starting prefill, decode and proxy"),
                      timeout_s=args.start_timeout)
        info = running.info()
        if args.json:
            emit_json(info)
        else:
            print(f"serving {spec.name} disaggregated at {info['url']}")
            print("\n".join(info["topology"]))
            for name, m in info["members"].items():
                print(f"{name} ({m['url']}, ready in {m['start_s']:.1f} s, {m['rss_mib']} MiB, "
                      f"log {m['log']}):\n  {m['command']}")
            print("Ctrl-C stops all three.", flush=True)
        while True:  # returns only when a member ends on its own
            running.check()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        print("\nstopping the topology ...", flush=True)
        return 0
    finally:
        running.stop()
