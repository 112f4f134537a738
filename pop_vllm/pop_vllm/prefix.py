"""Prefix caching that keeps POP exact: every block's hash says what its K/V was computed under.

vLLM's prefix cache reuses a block when the chained hash of its tokens (and extra keys: LoRA,
multimodal inputs, the request's cache_salt) matches. Under POP that is not enough: a prompt
position's K/V in the skipped layers differs between the pruned path (x_1..x_{N-1}) and the full
one (x_N, generated tokens, every position of a full request), and between skip sets, variants
and repair maps. So each block of a request hashed in the engine core gets one more extra key:

- nothing for a stock request (no POP settings in force): full blocks stay shareable as before;
- ("pop", settings key) for a block whose positions all took the pruned path: reusable by any
  later request with the same settings and the same tokens before it (a multi-turn chat's
  earlier turns);
- ("pop", settings key, where the full path starts) for the block holding the boundary token
  and after it: another request's pruned lookup never matches it;
- nothing for a request that asked for prompt log-probs: the worker runs all its tokens on the
  full path, so its K/V are the stock model's.

The settings are the engine's at the request's arrival: those it was started with, then those
of the latest run-time switch (`pop_set`, seen where the engine core relays it to the workers).
A request whose K/V came from a POP prefill instance through the connector is hashed with the
settings of that instance (its kv_transfer_params carry them), so a stock decode instance never
mixes those blocks with its own.
"""
from __future__ import annotations

from . import kv_keys
from . import settings as pop_settings
from .run_setting import RunSetting

_UNSET = object()
_current: tuple[str, str] | None = None  # (settings key, variant) in force, None: stock


def current() -> tuple[str, str] | None:
    return _current


def use(pop: RunSetting) -> None:
    """The settings new requests of this engine core are hashed with."""
    global _current
    key = kv_keys.settings_key(pop)
    _current = None if key is None else (key, str(pop.variant))


def request_key(request) -> tuple[str, str] | None:
    """(settings key, variant) of a request, fixed at its first hash (its arrival)."""
    got = getattr(request, "_pop_block_key", _UNSET)
    if got is _UNSET:
        params = request.kv_transfer_params
        if transferred(params):
            got = transferred_key(params)
        elif full_path(request):
            got = None  # every token ran the full model (step.py): stock K/V, hashed as stock
        else:
            got = _current
        request._pop_block_key = got
    return got


def full_path(request) -> bool:
    """Whether the request asked for prompt log-probs, which the worker answers on the full path."""
    params = getattr(request, "sampling_params", None)
    return params is not None and params.prompt_logprobs is not None


def transferred(params) -> bool:
    """Whether a connector's prefill instance computed this request's prompt K/V."""
    return bool(params and params.get("do_remote_prefill") and "pop_kv_file" in params)


def transferred_key(params) -> tuple[str, str] | None:
    """The settings that prefill instance ran (None: the stock model's K/V, hashed as stock)."""
    if not params.get("pop_kv_settings"):
        return None
    return str(params["pop_kv_settings"]), str(params.get("pop_kv_variant", "pop"))


def extra_key(request, start: int, end: int):
    """The POP extra key of the block [start, end) of `request` (None: nothing to add)."""
    key = request_key(request)
    if key is None:
        return None
    path = kv_keys.block_path(start, end, request.num_prompt_tokens, key[1])
    return ("pop", key[0]) if path is None else ("pop", key[0], path)


def install() -> None:
    """Wrap the block hasher's extra keys, the scheduler's start and the engine core's
    collective_rpc, once per process."""
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    extra = kv_cache_utils.generate_block_hash_extra_keys
    if getattr(extra, "_pop_wrapped", False):
        return
    init, rpc = Scheduler.__init__, EngineCore.collective_rpc

    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, mm_idx = extra(request, start_token_idx, end_token_idx, start_mm_idx)
        pop = extra_key(request, start_token_idx, end_token_idx)
        return (keys if pop is None else (keys or ()) + (pop,)), mm_idx

    def scheduler_init(self, vllm_config, *args, **kwargs):
        # The scheduler is built in the engine core after the plugins load (EngineCore.__init__
        # loads them itself, too late to wrap it): the engine's own settings start here.
        use(_engine_settings(vllm_config))
        init(self, vllm_config, *args, **kwargs)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        out = rpc(self, method, timeout, args, kwargs)
        if method == "pop_set" and out:  # what the workers took (a refused switch raised)
            got = out[0]
            use(RunSetting(**got))
        return out

    generate_block_hash_extra_keys._pop_wrapped = True
    kv_cache_utils.generate_block_hash_extra_keys = generate_block_hash_extra_keys
    Scheduler.__init__ = scheduler_init
    EngineCore.collective_rpc = collective_rpc


def _engine_settings(vllm_config) -> RunSetting:
    """The POP settings an engine was started with (none for a stock architecture)."""
    model = vllm_config.model_config
    if not set(model.architectures or ()) & set(pop_settings.ARCHITECTURES.values()):
        return RunSetting.full()
    hf = model.hf_config
    return pop_settings.engine_setting(getattr(hf, "pop", None), hf.num_hidden_layers)
