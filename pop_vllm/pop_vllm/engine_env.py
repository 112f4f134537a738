"""Environment for every process that starts a vLLM engine here (pure: no vLLM import).

No usage statistics leave the machine, nothing is fetched from a hub, the engine binds loopback,
caches stay under the project's cache/, and the KV cache is small (vLLM's CPU default takes most of
the machine's memory).
"""
from __future__ import annotations

import os
from pathlib import Path


# The plugin's worker methods, called by name through LLM.collective_rpc (pop_vllm/control.py)
# or the control route; SWITCH changes the run setting (pop_vllm/switch.py drains first).
SWITCH = "pop_set"
STATS = "pop_stats"
RESET_STATS = "pop_reset_stats"
FORWARD_SECONDS = "pop_forward_seconds"
KV_STATS = "pop_kv_stats"
CONTROL_METHODS = (SWITCH, STATS, RESET_STATS, FORWARD_SECONDS, KV_STATS)

# vLLM environment names read outside engine_env() (the driver, the server's command line).
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # each rank's cores
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"  # "0": the engine core in this process
PLUGINS_ENV = "VLLM_PLUGINS"  # the plugins vLLM loads (a name no plugin has: none, stock vLLM)
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # vLLM's unguarded development routes: never passed on

# The run-time control route (pop_vllm.guards): the secret comes to the engine in its environment
# (readable only by the user who started it, unlike the command line), never in a log or a command.
CONTROL_TOKEN_ENV = "POP_VLLM_CONTROL_TOKEN"
CONTROL_ROUTE = "/pop/control"
GUARD = "pop_vllm.guards.ControlGuard"  # the API server's --middleware


def rank_cpus(world_size: int, cpus=None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `world_size` ranks (tensor x pipeline parallel): the cores
    this process may use, split evenly, one list per rank ("0|1"; vLLM's automatic binding gives
    each rank a NUMA node, and this machine has one). ValueError when there are fewer cores than
    ranks."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if world_size < 1 or len(cpus) < world_size:
        raise ValueError(f"{world_size} engine ranks (tensor x pipeline parallel) need a core each; "
                         f"this process may use {len(cpus)}")
    per = len(cpus) // world_size
    return "|".join(",".join(map(str, cpus[r * per:(r + 1) * per])) for r in range(world_size))


def engine_env(cache_root: str | Path, kv_cache_gib: int = 1, threads: int | None = None,
               world_size: int = 1, cpus=()) -> dict:
    """kv_cache_gib: whole GiB (vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer) per rank;
    world_size: tensor x pipeline parallel ranks (> 1: each bound to its own cores); cpus: the
    cores the engine is pinned to (its ranks split them; empty: this process's own)."""
    cache_root = Path(cache_root)
    if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
        raise ValueError(f"kv_cache_gib must be a whole number of GiB >= 1, got {kv_cache_gib}")
    env = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
        "VLLM_CACHE_ROOT": str(cache_root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "inductor"),
        "HF_HOME": str(cache_root / "hf"),
        "VLLM_USE_V2_MODEL_RUNNER": "0",
    }
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if world_size > 1 or cpus:
        env[BIND_ENV] = rank_cpus(world_size, cpus or None)
    return env


# What engine_env() may set: the environment a shown command line needs to be the same engine.
ENGINE_ENV_NAMES = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_HOST_IP", "HF_HUB_OFFLINE",
                    "TRANSFORMERS_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT",
                    "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "VLLM_USE_V2_MODEL_RUNNER",
                    "OMP_NUM_THREADS", BIND_ENV)


def apply(cache_root: str | Path, **kw) -> None:
    """Set the defaults in this process (values the caller already set win)."""
    for k, v in engine_env(cache_root, **kw).items():
        os.environ.setdefault(k, v)
