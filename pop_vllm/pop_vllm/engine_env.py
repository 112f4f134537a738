"""Environment for every process that starts a vLLM engine here (pure: no vLLM import).

No usage statistics leave the machine, nothing is fetched from a hub, the engine binds loopback,
caches stay under the project's cache/, and the KV cache is small (vLLM's CPU default takes most of
the machine's memory).
"""
from __future__ import annotations

import os
from pathlib import Path


def engine_env(cache_root: str | Path, kv_cache_gib: int = 1, threads: int | None = None) -> dict:
    """kv_cache_gib: whole GiB (vLLM reads VLLM_CPU_KVCACHE_SPACE as an integer)."""
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
    return env


def apply(cache_root: str | Path, **kw) -> None:
    """Set the defaults in this process (values the caller already set win)."""
    for k, v in engine_env(cache_root, **kw).items():
        os.environ.setdefault(k, v)
