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

The key comes from the engine's own settings only, pinned per request when it arrives in the
engine core (`pin`, in order with run-time switches, see switch.py): those the engine was started
with or switched to. A request's kv_transfer_params count only on a KV consumer running the POP
connector, and then only to say that its prompt K/V come from the producer: the settings they
were computed under are the consumer's configured ones (`kv_keys.producer_key`, checked against
the file when loaded), never the request's. On any other engine the params change nothing.

On a POP engine a request asking for prompt log-probs never reads cached or transferred K/V,
whatever its skip_reading_prefix_cache says: vLLM computes prompt log-probs only at positions
the step computes, and leaves the others unset (uninitialised memory), so such a request is
recomputed in full and its log-probs are complete.
"""
from __future__ import annotations

from . import kv_keys
from . import settings as pop_settings
from .run_setting import RunSetting
from .run_setting import RunSetting

_UNSET = object()
_current: tuple[str, str] | None = None  # (settings key, variant) new requests get; None: stock
_consumer = _UNSET  # on a KV consumer: the key of the K/V it loads (None: stock's)
_engine: dict = {"pop": False, "hf": None, "layers": 0, "weights": None}  # this engine core's model


def current() -> tuple[str, str] | None:
    return _current


def use(pop: RunSetting) -> None:
    """The settings requests arriving from now on are pinned to."""
    use_key(key_of(pop))


def use_key(key: tuple[str, str] | None) -> None:
    global _current
    _current = key


def key_of(pop: RunSetting) -> tuple[str, str] | None:
    key = kv_keys.settings_key(pop, _engine["weights"])
    return None if key is None else (key, str(pop.variant))


def configure(vllm_config) -> None:
    """This engine core's own settings: its model's POP settings, and (a KV consumer running the
    POP connector) what the K/V it loads were computed under."""
    global _consumer
    model = vllm_config.model_config
    hf = model.hf_config
    pop = bool(set(model.architectures or ()) & set(pop_settings.ARCHITECTURES.values()))
    # an int8 copy's K/V get a key of their own (the weights' tag)
    _engine.update(pop=pop, hf=hf, layers=hf.num_hidden_layers,
                   weights=kv_keys.weights_tag(getattr(model, "model", None)))
    use(pop_settings.engine_setting(getattr(hf, "pop", None), hf.num_hidden_layers) if pop
        else RunSetting.full())
    t = vllm_config.kv_transfer_config
    _consumer = _UNSET
    if t is not None and t.kv_connector == kv_keys.CONNECTOR and t.is_kv_consumer:
        _consumer = kv_keys.producer_key(t.kv_connector_extra_config)


def engine() -> dict:
    """{"pop": a Pop* architecture, "hf": its config, "layers": its layer count, "weights": the
    weights' tag of a quantised copy, or None}."""
    return _engine


def full_path(request) -> bool:
    """Whether the request asked for prompt log-probs, which the worker answers on the full path."""
    params = getattr(request, "sampling_params", None)
    return params is not None and params.prompt_logprobs is not None


def loads_transfer(request) -> bool:
    """Whether this engine loads the request's prompt K/V from a producer: a KV consumer, params
    naming a file of its N-1 positions, and a request that reads cached K/V at all."""
    return (_consumer is not _UNSET and not full_path(request)
            and not getattr(request, "skip_reading_prefix_cache", False)
            and kv_keys.loadable(request.kv_transfer_params, request.num_prompt_tokens))


def arrival_key(request) -> tuple[str, str] | None:
    """The key a request arriving now gets, from this engine's own settings."""
    if full_path(request):
        return None  # every token runs the full model (step.py): stock K/V, hashed as stock
    if loads_transfer(request):
        return _consumer  # the producer's K/V, as this engine was configured to load them
    return _current


def request_key(request) -> tuple[str, str] | None:
    """(settings key, variant) of a request: pinned at its arrival (`pin`); a hash taken before
    (vLLM hashes a request where it builds it, in the engine core's input thread) uses the key
    of that moment, and `pin` redoes it when the two differ."""
    got = getattr(request, "_pop_block_key", _UNSET)
    if got is _UNSET:
        got = request._pop_block_key = arrival_key(request)
    return got


def pin(request) -> None:
    """At the request's arrival in the engine core (EngineCore.add_request, which runs in order
    with run-time switches): its key, its hashes redone if they were taken under another."""
    if _engine["pop"] and full_path(request):
        request.skip_reading_prefix_cache = True  # its prompt log-probs must all be computed
    repin(request, arrival_key(request))


def repin(request, key) -> None:
    """Give a request that has not been scheduled yet another key, its block hashes redone."""
    before = getattr(request, "_pop_block_key", _UNSET)
    request._pop_block_key = key
    if before is not _UNSET and before != key and hasattr(request, "update_block_hashes"):
        request.block_hashes.clear()
        request.update_block_hashes()


def extra_key(request, start: int, end: int):
    """The POP extra key of the block [start, end) of `request` (None: nothing to add)."""
    key = request_key(request)
    if key is None:
        return None
    path = kv_keys.block_path(start, end, request.num_prompt_tokens, key[1])
    return ("pop", key[0]) if path is None else ("pop", key[0], path)


def wrap_extra_keys(extra):
    """The block hasher's extra keys with POP's (patches.py; the engine core's own hooks, which
    configure and pin, are switch.py's)."""
    def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
        keys, mm_idx = extra(request, start_token_idx, end_token_idx, start_mm_idx)
        pop = extra_key(request, start_token_idx, end_token_idx)
        return (keys if pop is None else (keys or ()) + (pop,)), mm_idx

    return generate_block_hash_extra_keys
