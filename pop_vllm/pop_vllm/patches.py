"""Every vLLM attribute the plugin replaces or adds, in one table (pure: no vLLM import).

A newcomer porting the plugin to another vLLM reads this table first: each row names the vLLM
owner, the attribute, the plugin function that builds the replacement from vLLM's original (or
the method added), and why. `patching.py` applies the rows once per process; nothing else in the
plugin assigns to a vLLM class or module.
"""
from __future__ import annotations

from dataclasses import dataclass

from .engine_env import CONTROL_METHODS


@dataclass(frozen=True)
class Patch:
    owner: str  # "module:Class" or "module" (a module-level function)
    attribute: str
    builder: str  # "pop_vllm module:function": original -> replacement; for an addition, the method
    why: str
    added: bool = False  # a new method (vLLM has none of that name), not a wrapped one


_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_CORE = "vllm.v1.engine.core:EngineCore"
_SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"

PATCHES: tuple[Patch, ...] = (
    Patch(_RUNNER, "_model_forward", "step:wrap_model_forward",
          "record each step's prompt lengths and computed/scheduled tokens, which vLLM's "
          "attention metadata lacks, for POP's per-token plan"),
    Patch("vllm.v1.worker.utils:AttentionGroup", "build_metadata", "step:wrap_build_metadata",
          "keep the step's common metadata so a skipped layer's builder can build metadata for "
          "the full tokens only"),
    Patch("vllm.v1.core.kv_cache_utils", "generate_block_hash_extra_keys",
          "prefix:wrap_extra_keys",
          "each cached block's hash says what its K/V was computed under (prefix caching exact)"),
    Patch(_SCHEDULER, "__init__", "switch:wrap_scheduler_init",
          "the engine core's own settings start when its scheduler is built (after plugins load)"),
    Patch(_SCHEDULER, "schedule", "switch:wrap_schedule",
          "hold back requests pinned to a switch the workers have not applied yet"),
    Patch(_CORE, "add_request", "switch:wrap_add_request",
          "pin a request's settings (and its block hashes) at its arrival, in order with switches"),
    Patch(_CORE, "collective_rpc", "switch:wrap_collective_rpc",
          "a run-time switch drains the requests in flight before the workers change settings"),
    Patch("vllm.v1.engine.core:EngineCoreProc", "_process_engine_step", "switch:wrap_engine_step",
          "apply a waiting switch once the last request of the old settings has finished"),
    Patch("vllm.model_executor.kernels.linear.scaled_mm.cpu", "check_cpu_sgl_kernel",
          "int8_kernel:wrap_sgl_check",
          "an fp32 model's int8 (W8A8) linears take the oneDNN kernel: the AMX one refuses fp32 "
          "activations (an int8 prefill instance, docs/serving.md)"),
) + tuple(
    Patch("vllm.v1.worker.worker_base:WorkerBase", name, f"control:{name}",
          "run-time control through LLM.collective_rpc by name (no pickled callables)",
          added=True)
    for name in CONTROL_METHODS
)
