"""Run-time control of a POP engine through `LLM.collective_rpc` (runs in every worker).

`plugin.register` adds these as methods of vLLM's worker class, so they are called by name
(a callable would need vLLM's insecure pickle serialization):

    llm.collective_rpc("pop_set", args=({"skip": [20, 21, 22], "variant": "pop"},))
    llm.collective_rpc("pop_set", args=({"skip": [20, 21], "variant": "pop_repair",
                                          "repair": "/abs/KEY.safetensors"},))
    llm.collective_rpc("pop_stats")  # one dict per worker
"""
from __future__ import annotations

from .stats import new_stats

# The functions below are added to vLLM's worker class under these names (engine_env.py, patches.py).


def _pop_model(worker):
    model = worker.model_runner.get_model()
    if not hasattr(model, "set_pop"):
        raise TypeError(f"the engine runs {type(model).__name__}, not a POP model: "
                        "start it with pop_vllm.overrides(...) as hf_overrides")
    return model


def pop_set(worker, config: dict) -> dict:
    """Switch to the run setting of `config` (RunSetting.as_config's fields) for the next steps;
    returns the new one. A bad setting raises SettingError and leaves the old one in force."""
    model = _pop_model(worker)
    model.set_pop(config)
    return model.pop.as_config()


def pop_stats(worker) -> dict:
    """Counters since the last reset: steps, pop_steps, pruned_tokens, ... (stats.new_stats)."""
    model = _pop_model(worker)
    split = None if model.pop_split is None else model.pop_split.state()
    return dict(model.pop_stats, **model.pop.as_config(), split=split)


def pop_forward_seconds(worker) -> float:
    """Seconds this worker spent in the model's forward since it started (a clock for benchmarks
    that leaves out the engine's scheduling, sampling and inter-process messages)."""
    return _pop_model(worker).pop_forward_s


def pop_reset_stats(worker) -> None:
    _pop_model(worker).pop_stats = new_stats()


def pop_kv_stats(worker) -> dict | None:
    """The POP KV connector's counters in this worker (saved / loaded requests, tokens, bytes,
    seconds, load errors); None without a connector. Works on stock models too."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return None
    return dict(getattr(get_kv_transfer_group(), "stats", None) or {})
