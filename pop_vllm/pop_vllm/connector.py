"""A KV connector that hands a prompt's K/V from a (POP) prefill instance to a decode instance
through files, on any platform vLLM runs on (CPU included): every layer, every prompt position.

    --kv-transfer-config '{"kv_connector": "PopKVConnector",
                           "kv_connector_module_path": "pop_vllm.connector",
                           "kv_role": "kv_producer", "engine_id": "prefill-0",
                           "kv_connector_extra_config": {"pop_kv_dir": "/abs/folder"}}'

(`kv_keys.transfer_config` builds it; the decode instance takes kv_role kv_consumer.)

Why not vLLM's ExampleConnector: its per-layer hooks wrap the attention call, and POP's skipped
layers do not attend for pruned tokens, so a step made only of pruned prompt chunks saves nothing
for them; it also saves a request's prompt once, in its first step (a chunked prompt's later
chunks are lost), and hands over whole blocks only (a prompt shorter than a block moves nothing).
Here the save runs once per step after the forward (`wait_for_save`), from the paged cache, for
each request whose positions 0..N-2 are complete: every layer's blocks covering them, whatever
wrote them. The decode instance loads those N-1 positions and computes x_N and the generated
tokens itself, which POP runs in full anyway: a stock decode instance gives POP's tokens.

The protocol is NIXL's, so vLLM's P/D routers drive it unchanged: the prefill request carries
kv_transfer_params {"do_remote_decode": true}; its response returns {"do_remote_prefill": true,
"pop_kv_file": ..., "pop_kv_tokens": N-1, "pop_kv_settings": ..., "pop_kv_variant": ...}, which
the router passes to the decode request. What the file's K/V were computed under is the decode
instance's own configuration (kv_connector_extra_config "pop_kv_settings" / "pop_kv_variant", the
producer's settings, written by kv_keys.transfer_config), checked against the settings the
producer recorded in the file: a client's kv_transfer_params never decide how the K/V are hashed
in the prefix cache. A request that asks for prompt log-probs, or sets
skip_reading_prefix_cache, loads nothing (its prompt is computed where it runs). Blocks move whole (the backend's own layout, which on
CPU packs keys per block): both instances need the same block size, dtype and tensor-parallel
size, checked at load. A missing, foreign or damaged file fails that request with one line
(vLLM's kv_load_failure_policy "fail"), never silently recomputes it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from . import prefix
from .kv_keys import ENGINE_ID, STOCK_KEY, producer_key

logger = init_logger("vllm.pop.connector")
TTL_S = 600.0  # a file no decode instance took within this long is removed by its producer
_FILE = re.compile(r"[0-9a-f]{40}")


class TransferError(RuntimeError):
    """A transfer file that cannot be loaded into this engine; the message is one line."""


@dataclass
class Job:
    """One request's K/V to save (producer) or load (consumer) in this step."""

    req_id: str
    name: str  # file stem under the storage folder: "<engine id>/<40 hex>"
    tokens: list[int]  # the prompt positions moved, 0..n-1 (n = N-1)
    block_ids: list[int]  # the request's blocks, in position order
    start: int = 0  # consumer: positions already computed here (a block-aligned local hit)
    settings: str = STOCK_KEY  # the settings key the K/V are computed under (producer's)


@dataclass
class PopKVMetadata(KVConnectorMetadata):
    saves: list[Job] = field(default_factory=list)
    loads: list[Job] = field(default_factory=list)


class PopKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        folder = cfg.get_from_extra_config("pop_kv_dir", None)
        if not folder or not os.path.isabs(str(folder)):
            raise TransferError("PopKVConnector needs kv_connector_extra_config "
                                "{'pop_kv_dir': ABSOLUTE_FOLDER}")
        if not ENGINE_ID.fullmatch(str(cfg.engine_id)):
            raise TransferError(f"PopKVConnector needs an engine_id of letters, digits, '.', '_' "
                                f"or '-', got {cfg.engine_id!r:.80}")
        self._dir = Path(folder)
        self._engine_id = str(cfg.engine_id)
        self._block_size = vllm_config.cache_config.block_size
        self._ttl_s = float(cfg.get_from_extra_config("pop_kv_ttl_s", TTL_S))
        self._producer, self._consumer = cfg.is_kv_producer, cfg.is_kv_consumer
        if self._consumer:
            try:
                producer_key(cfg.kv_connector_extra_config)
            except ValueError as e:
                raise TransferError(str(e)) from None
        # scheduler side
        self._to_save: dict[str, tuple] = {}  # req id -> (the first N-1 tokens, settings key)
        self._blocks: dict[str, list[int]] = {}  # req id -> block ids so far
        self._saved: dict[str, str] = {}  # req id -> file name, once its save is scheduled
        self._to_load: dict[str, tuple] = {}  # req id -> (request, tokens loaded from outside)
        self._swept = 0.0
        # worker side
        self._caches: dict[str, torch.Tensor] = {}
        self._errors: set[int] = set()
        self.stats = {"saved_requests": 0, "saved_tokens": 0, "loaded_requests": 0,
                      "loaded_tokens": 0, "load_errors": 0, "saved_bytes": 0, "loaded_bytes": 0,
                      "save_s": 0.0, "load_s": 0.0, "layers": 0}
        if role == KVConnectorRole.SCHEDULER and self._producer:
            self._clear_own_folder()

    # ---------------------------------------------------------------- scheduler side

    def _clear_own_folder(self) -> None:
        """Stale K/V is never loaded: a producer starts with an empty folder of its own."""
        own = self._dir / self._engine_id
        if own.is_dir():
            for f in own.iterdir():
                f.unlink(missing_ok=True)
        own.mkdir(parents=True, exist_ok=True)
        logger.info("POP KV connector: %s writes to %s (emptied)", self._engine_id, own)

    def on_new_request(self, request) -> None:
        params = request.kv_transfer_params or {}
        n = request.num_prompt_tokens - 1  # x_1..x_{N-1}; x_N runs on the decode side
        if self._producer and params.get("do_remote_decode") and n > 0:
            self._to_save[request.request_id] = (list(request.prompt_token_ids[:n]),
                                                 _settings(request))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        if not self._consumer or not prefix.loads_transfer(request):
            return 0, False  # the flag and prompt log-probs are honoured here, not only by vLLM
        return max(request.num_prompt_tokens - 1 - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._to_load[request.request_id] = (request, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = PopKVMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            self._blocks[new.req_id] = list(new.block_ids[0])
            self._jobs(meta, new.req_id, new.num_computed_tokens, scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            got = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:  # a preempted request: its blocks anew
                self._blocks[rid] = list(got[0]) if got else []
            elif got:
                self._blocks.setdefault(rid, []).extend(got[0])
            self._jobs(meta, rid, cached.num_computed_tokens[i], scheduled.get(rid, 0))
        self._to_load.clear()
        return meta

    def _jobs(self, meta: PopKVMetadata, rid: str, computed: int, scheduled: int) -> None:
        if rid in self._to_load:
            request, external = self._to_load[rid]
            n = request.num_prompt_tokens - 1
            # positions n - external.. come from the file; those before were a local cache hit
            meta.loads.append(Job(rid, str(request.kv_transfer_params["pop_kv_file"]),
                                  list(request.prompt_token_ids[:n]),
                                  list(self._blocks.get(rid, [])), start=n - external,
                                  settings=_settings(request)))
        tokens, settings = self._to_save.get(rid, (None, None))
        if tokens is not None and rid not in self._saved and computed + scheduled >= len(tokens):
            name = f"{self._engine_id}/{_digest(rid, tokens)}"
            meta.saves.append(Job(rid, name, tokens, list(self._blocks.get(rid, [])),
                                  settings=settings))
            self._saved[rid] = name

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._blocks.pop(rid, None)
        self._to_save.pop(rid, None)
        name = self._saved.pop(rid, None)
        params = request.kv_transfer_params if self._consumer else None
        if params and params.get("do_remote_prefill") and _valid_name(params.get("pop_kv_file")):
            # this decode request is done with its file (every rank's)
            stem = self._dir / params["pop_kv_file"]
            for f in stem.parent.glob(stem.name + ".rank*.safetensors"):
                f.unlink(missing_ok=True)
        if self._producer:
            self._sweep()
        if name is None:
            return False, None
        key = prefix.request_key(request)
        return False, {"do_remote_prefill": True, "do_remote_decode": False,
                       "pop_kv_file": name, "pop_kv_tokens": request.num_prompt_tokens - 1,
                       "pop_kv_settings": None if key is None else key[0],
                       "pop_kv_variant": "full" if key is None else key[1],
                       "remote_engine_id": self._engine_id, "remote_block_ids": None,
                       "remote_host": None, "remote_port": None}

    def _sweep(self) -> None:
        """Remove this producer's files no decode instance took within the TTL (a client that
        went away between the two halves), at most once a minute."""
        now = time.time()
        if now - self._swept < 60:
            return
        self._swept = now
        for f in (self._dir / self._engine_id).glob("*.safetensors"):
            try:
                if now - f.stat().st_mtime > self._ttl_s:
                    f.unlink()
            except OSError:
                pass

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        blocks = {t.shape[0] for t in kv_caches.values()}
        if len(blocks) != 1:
            raise TransferError(f"PopKVConnector moves whole blocks along a KV cache's first "
                                f"dimension; this backend's caches differ there: {sorted(blocks)}")
        self._caches = dict(sorted(kv_caches.items()))
        self.stats["layers"] = len(self._caches)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        for job in self._get_connector_metadata().loads:
            t0 = time.perf_counter()
            try:
                self._load(job)
            except (OSError, TransferError, KeyError, ValueError, RuntimeError) as e:
                n_blocks = math.ceil(len(job.tokens) / self._block_size)
                self._errors.update(job.block_ids[job.start // self._block_size:n_blocks])
                self.stats["load_errors"] += 1
                logger.error("POP KV connector: request %s cannot load %s: %s", job.req_id,
                             job.name, str(e).splitlines()[0] if str(e) else type(e).__name__)
            self.stats["load_s"] += time.perf_counter() - t0

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish in start_load_kv, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return  # saved after the step (wait_for_save): POP's skipped layers skip this hook

    def wait_for_save(self) -> None:
        for job in self._get_connector_metadata().saves:
            t0 = time.perf_counter()
            self._save(job)
            self.stats["save_s"] += time.perf_counter() - t0

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def _path(self, name: str) -> Path:
        from vllm.distributed import get_tensor_model_parallel_rank

        if not _valid_name(name):  # the params come from the client: never a path of its own
            raise TransferError(f"pop_kv_file {name!r:.80} is not a file name of this connector")
        return self._dir / f"{name}.rank{get_tensor_model_parallel_rank()}.safetensors"

    def _save(self, job: Job) -> None:
        """Every layer's blocks covering positions 0..n-1, written whole then renamed (a reader
        never sees half a file)."""
        n_blocks = math.ceil(len(job.tokens) / self._block_size)
        if len(job.block_ids) < n_blocks:
            raise TransferError(f"request {job.req_id} holds {len(job.block_ids)} blocks, "
                                f"{n_blocks} needed")
        ids = torch.tensor(job.block_ids[:n_blocks], dtype=torch.long)
        tensors = {name: cache.index_select(0, ids.to(cache.device)).cpu()
                   for name, cache in self._caches.items()}  # (n_blocks, ...) each
        path = self._path(job.name)
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"tokens": json.dumps(job.tokens),
                                               "block_size": str(self._block_size),
                                               "settings": job.settings})
        os.replace(tmp, path)
        self.stats["saved_requests"] += 1
        self.stats["saved_tokens"] += len(job.tokens)
        self.stats["saved_bytes"] += sum(t.numel() * t.element_size() for t in tensors.values())

    def _load(self, job: Job) -> None:
        n_blocks = math.ceil(len(job.tokens) / self._block_size)
        first = job.start // self._block_size
        dst = torch.tensor(job.block_ids[first:n_blocks], dtype=torch.long)
        with safe_open(str(self._path(job.name)), framework="pt") as f:
            meta = f.metadata() or {}
            if int(meta.get("block_size", -1)) != self._block_size:
                raise TransferError(f"written with block size {meta.get('block_size')}, this "
                                    f"engine has {self._block_size}")
            if json.loads(meta.get("tokens", "null")) != job.tokens:
                raise TransferError("its prompt tokens are not this request's")
            if meta.get("settings") != job.settings:
                raise TransferError(f"its K/V were computed under settings "
                                    f"{meta.get('settings')!r:.40}, this engine loads "
                                    f"{job.settings!r} (its kv_connector_extra_config)")
            missing = sorted(set(self._caches) - set(f.keys()))
            if missing:
                raise TransferError(f"no K/V for {len(missing)} layer(s), e.g. {missing[0]}")
            for name, cache in self._caches.items():
                src = f.get_slice(name)[first:n_blocks]  # (blocks, ...) as the producer's cache
                if tuple(src.shape[1:]) != tuple(cache.shape[1:]) or src.dtype != cache.dtype:
                    raise TransferError(f"{name}: blocks of {tuple(src.shape[1:])} {src.dtype}, "
                                        f"this engine's are {tuple(cache.shape[1:])} {cache.dtype}")
                cache.index_copy_(0, dst.to(cache.device), src.to(cache.device))
                self.stats["loaded_bytes"] += src.numel() * src.element_size()
        self.stats["loaded_requests"] += 1
        self.stats["loaded_tokens"] += len(job.tokens) - job.start


def _settings(request) -> str:
    """The settings key a request's prompt K/V are computed under (prefix.request_key: the
    engine's own settings at its arrival; a consumer's loads: its configured producer's)."""
    key = prefix.request_key(request)
    return STOCK_KEY if key is None else key[0]


def _valid_name(name) -> bool:
    engine, _, stem = str(name).partition("/")
    return bool(ENGINE_ID.fullmatch(engine) and _FILE.fullmatch(stem))


def _digest(req_id: str, tokens: list[int]) -> str:
    h = hashlib.sha1(req_id.encode())
    h.update(json.dumps(tokens).encode())
    return h.hexdigest()
