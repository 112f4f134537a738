"""Arguments shared by the serving commands (serve, serve-bench)."""
from __future__ import annotations

import sys

from pop_analysis.commands._common import (
    MAX_TOKENS,
    MAX_WAIT_S,
    Num,
    quiet_hf,
    seconds,
    skip_from_args,
)
from pop_analysis.commands._repair import add_repair_arg
from pop_analysis.engine.models import DEFAULT_MODEL
from pop_analysis.serving.server import START_TIMEOUT_S
from pop_analysis.serving.spec import model_dir, n_layers, spec_for
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import SERVED


def add_engine_args(p, variant_default: str = "pop") -> None:
    """The model and engine flags every serving command shares."""
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"registry name or local model directory (default {DEFAULT_MODEL})")
    p.add_argument("--variant", default=variant_default, choices=SERVED,
                   help=f"what the engine serves (default {variant_default}; full = stock vLLM)")
    add_repair_arg(p)  # the maps of --variant pop_repair (its stored file goes to the engine)
    p.add_argument("--kv-cache-gib", type=Num(int, 1, 4096), default=1,
                   help="the engine's KV cache in GiB (VLLM_CPU_KVCACHE_SPACE, default 1)")
    p.add_argument("--max-model-len", type=Num(int, 16, MAX_TOKENS), default=4096,
                   help="longest request in tokens")
    p.add_argument("--dtype", default="float32", help="engine dtype (default float32, as POP Lab on CPU)")
    p.add_argument("--tensor-parallel-size", type=Num(int, 1, 1024), default=1, metavar="N",
                   help="engine ranks sharing each layer, one core each (default 1)")
    p.add_argument("--pipeline-parallel-size", type=Num(int, 1, 1024), default=1, metavar="N",
                   help="engine stages holding consecutive layers, one core each (default 1)")
    p.add_argument("--compiled", action="store_true",
                   help="let vLLM compile the model (slower start; default eager)")
    p.add_argument("--start-timeout", type=seconds(MAX_WAIT_S), default=START_TIMEOUT_S,
                   metavar="SECONDS",
                   help=f"give up when the engine has not answered after this long (default {START_TIMEOUT_S:g})")


def spec_from_args(args, variant: str | None = None, port: int = 0):
    directory = model_dir(args.model)
    skip = skip_from_args(args, n_layers(directory))
    if args.kv_cache_gib <= 0 or args.max_model_len < 16 or args.start_timeout <= 0:
        raise ValueError("--kv-cache-gib and --start-timeout must be positive, --max-model-len >= 16")
    if args.tensor_parallel_size < 1 or args.pipeline_parallel_size < 1:
        raise ValueError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
    variant = variant or args.variant
    setting = RunSetting(skip, variant if variant != "pop_repair" else "pop")
    if variant == "pop_repair" or args.repair:
        if variant != "pop_repair":
            raise ValueError(f"--repair is for --variant pop_repair, not {variant}")
        spec_for(args.model, setting)  # a bad skip set or model fails before loading it
        setting = RunSetting(skip, variant, repair_file(args.model, skip, args.repair))
    return spec_for(args.model, setting, port=port,
                     kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len,
                     dtype=args.dtype, eager=not args.compiled,
                     tensor_parallel=args.tensor_parallel_size,
                     pipeline_parallel=args.pipeline_parallel_size)


def repair_file(model: str, skip, spec: str | None) -> str:
    """--repair KEY|auto -> the stored maps file the engine's pop_repair reads, from the repair
    store and the checkpoint's K/V weights; the model is loaded only to fit one (auto, none
    stored yet)."""
    from pop_analysis.engine.models import load_model
    from pop_analysis.progress import terminal_bar
    from pop_analysis.repair.store import ensure, maps_file, stored_maps_file

    if not spec:
        raise ValueError("the pop_repair variant needs --repair KEY or --repair auto")
    directory = model_dir(model)
    found = stored_maps_file(directory, n_layers(directory), skip, spec)
    if found is not None:
        return found
    quiet_hf()
    return maps_file(ensure(load_model(model, device="cpu"), skip, "auto", terminal_bar).key)


def stderr_progress(what: str):
    """progress(done, total, message) of an engine start as one rewritten stderr line (written
    when it changes)."""
    last = []

    def show(done, total, message):
        if last == [done, message]:
            return
        last[:] = [done, message]
        sys.stderr.write(f"\r{what}: {done}/{total} {message:<40}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show
