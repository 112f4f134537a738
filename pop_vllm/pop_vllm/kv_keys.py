"""What a block of K/V was computed under, for K/V that leaves the step that wrote it (pure: no
vLLM, no torch): prefix caching hands it to later requests, the KV connector to another engine.

POP's K/V of a prompt position depends on the settings (skip set, variant, repair maps) and on
whether the position took the pruned path (x_1..x_{N-1}) or the full one (x_N, generated tokens).
`settings_key` names the first; `block_path` the second, per block of a request; the connector's
storage folder is per model and settings key.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .plan import first_full_position
from .run_setting import RunSetting
from .variants import SERVED

CONNECTOR = "PopKVConnector"  # the class in pop_vllm.connector (loaded by module path)
CONNECTOR_MODULE = "pop_vllm.connector"
STOCK_KEY = "full"  # the storage folder's suffix for a stock (or full-variant) prefill engine
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")  # what a folder name may not hold
ENGINE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEY = re.compile(r"[0-9a-f]{16}")  # settings_key's digest


def settings_key(pop: RunSetting, weights: str | None = None) -> str | None:
    """A short digest of settings that change prompt K/V (None: the stock model, whose K/V needs
    no salt). A repair's maps enter by content, so a refitted file with the same path differs;
    `weights` (weights_tag) names a quantised copy of the model the K/V were computed with."""
    if not pop.active and weights is None:
        return None
    body = {"skip": list(pop.skip), "variant": str(pop.variant)}
    if pop.repair:
        body["repair"] = _file_digest(pop.repair)
    if weights is not None:
        body["weights"] = weights
    return _digest(body)


def _digest(value) -> str:
    """The 16 hex digits a key is (_KEY), of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def weights_tag(model_dir: str | Path | None) -> str | None:
    """A short digest of a checkpoint's quantization config (its config.json), None for weights
    in the model's own precision: an int8 prefill instance's K/V are not an fp32 one's."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None  # not a local folder (a hub name): its weights are the model's own
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    return _digest(quant) if quant else None


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def block_path(start: int, end: int, prompt_len: int, variant: str):
    """The extra hash key of the block of positions [start, end) of a request: None when every
    position took the pruned path (reusable by any request with these settings and tokens),
    else where the full path begins inside the block (the block holding the boundary token) or
    "full" (a block after it: generated tokens). Full-path K/V of one request is not what
    another request's pruned path computes, so those blocks never match a pruned lookup."""
    first_full = int(first_full_position([prompt_len], variant)[0])
    if end <= first_full:
        return None
    return ("boundary", first_full - start) if start <= first_full else "full"


def storage_dir(root: str | Path, model_name: str, pop: RunSetting,
                weights: str | None = None) -> Path:
    """The connector's folder for one model and prefill setting (each producer instance writes
    into a subfolder of it named after its engine id, cleared when that engine starts)."""
    name = _NAME.sub("-", model_name).strip("-") or "model"
    return Path(root) / f"{name}-{settings_key(pop, weights) or STOCK_KEY}"


def transfer_config(role: str, folder: str | Path, engine_id: str,
                    producer: RunSetting = RunSetting.full(), weights: str | None = None) -> dict:
    """vLLM's --kv-transfer-config for the POP connector; role: kv_producer (the prefill
    instance), kv_consumer (the decode instance) or kv_both; producer: the settings the prefill
    instance computes prompt K/V under (a consumer hashes and checks the K/V it loads with
    them: they are part of the engine's own configuration, never taken from a request);
    weights: the producer's weights_tag (an int8 prefill instance)."""
    if role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise ValueError(f"unknown KV role {role!r}: kv_producer, kv_consumer or kv_both")
    if not ENGINE_ID.fullmatch(engine_id):
        raise ValueError(f"engine id {engine_id!r} must be letters, digits, '.', '_' or '-'")
    return {"kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": role, "engine_id": engine_id,
            "kv_connector_extra_config": {"pop_kv_dir": str(folder),
                                          **producer_config(producer, weights)}}


def producer_config(pop: RunSetting, weights: str | None = None) -> dict:
    """The extra-config entries naming what a producer's K/V were computed under."""
    key = settings_key(pop, weights)
    return {"pop_kv_settings": key or STOCK_KEY, "pop_kv_variant": str(pop.variant) if key else
            "full"}


def producer_key(extra) -> tuple[str, str] | None:
    """(settings key, variant) of the K/V a consumer loads, from its connector's extra config
    (None: the stock model's). ValueError, one line, when they are missing or malformed."""
    extra = extra if isinstance(extra, dict) else {}
    key, variant = extra.get("pop_kv_settings"), extra.get("pop_kv_variant", "full")
    if key == STOCK_KEY:
        return None
    if not (isinstance(key, str) and _KEY.fullmatch(key)) or variant not in SERVED:
        raise ValueError("a POP KV consumer needs kv_connector_extra_config {'pop_kv_settings': "
                         "the producer's settings key or 'full', 'pop_kv_variant': its variant} "
                         f"(kv_keys.transfer_config writes them), got {key!r:.40}, {variant!r:.40}")
    return key, str(variant)


def loadable(params, prompt_len: int) -> bool:
    """Whether a request's kv_transfer_params hand it a producer's K/V of positions 0..N-2 (a
    file named by the producer, checked when loaded). Read on a KV consumer only."""
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return False
    tokens = params.get("pop_kv_tokens")
    return ("pop_kv_file" in params and isinstance(tokens, int) and not isinstance(tokens, bool)
            and 0 < tokens == prompt_len - 1)
