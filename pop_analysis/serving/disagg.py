"""Prefill/decode disaggregation on one machine, the same code as across hosts: a prefill
instance (POP, or the full model), a decode instance and the proxy joining them.

    client -> proxy (vllm-router, P/D mode) -> prefill instance   (kv_producer, cores P)
                                            -> decode instance    (kv_consumer, cores D)

The prefill instance computes x_1..x_{N-1} of each prompt (POP's pruned path) and x_N, and its
KV connector (pop_vllm's PopKVConnector) writes every layer's K/V of positions 0..N-2 into a
folder per model and POP setting; the decode instance loads them, computes x_N and the generated
tokens, and answers. With `prefill_int8` the prefill instance serves the model's int8 copy
(serving/int8_checkpoint.py: those layers' Linears in int8) and the decode instance the fp32 model:
POP Lab's prefill-only int8, at cluster shape (the weights enter the K/V's settings key). Each
instance is pinned to its own cores. The producer empties its own subfolder when it starts, so stale K/V is never loaded. Across hosts the folder is a shared
file system; on GPUs the connector would be NIXL (docs/serving.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

from pop_analysis.engine.skipset import describe
from pop_analysis.serving.proxy import Proxy
from pop_analysis.serving.server import Engine, EngineSpec
from pop_analysis.serving.venv import ServingError
from pop_analysis.store.paths import cache_dir
from pop_vllm import kv_keys
from pop_vllm.precision import Precision
from pop_vllm.run_setting import RunSetting

DECODE_SIDES = ("pop", "full")  # the decode instance: the prefill's POP settings, or stock vLLM
BLOCK_SIZE = 32  # CPU attention's smallest block: a hand-off moves whole blocks of the cache
KEPT = "kept"  # prefill_int8: every layer the prefill instance does not skip


@dataclass(frozen=True)
class Topology:
    """Everything a disaggregated deployment needs, decided before anything starts."""

    prefill: EngineSpec  # the producer (its variant and skip set: POP or full)
    decode: EngineSpec  # the consumer
    proxy: EngineSpec  # the router's port and name (it loads no model)
    folder: str  # the connector's storage folder for this model and prefill setting
    prefill_int8: tuple[int, ...] = ()  # layers the prefill instance runs in int8 (its own copy)

    def describe(self) -> list[str]:
        """One line per pool, for the CLI and the Serve page."""
        def pool(s: EngineSpec) -> str:
            what = ("full model" if not s.pop else
                    f"{s.setting.variant}, skip {describe(s.setting.skip)}")
            if s is self.prefill and self.prefill_int8:
                what += f", int8 layers {describe(self.prefill_int8)}"
            return f"{what}, cores {','.join(map(str, s.cpus)) or 'any'}"
        return [f"prefill pool: 1 instance ({pool(self.prefill)}), K/V producer",
                f"decode pool: 1 instance ({pool(self.decode)}), K/V consumer",
                "proxy: vllm-router (P/D mode): prefill with max_tokens 1, then decode",
                f"K/V hand-off: pop_vllm's PopKVConnector through {self.folder}"]


def split_cores(n: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The machine's cores in two halves (prefill, decode); at least one each."""
    cores = sorted(os.sched_getaffinity(0)) if n is None else list(range(n))
    if len(cores) < 2:
        raise ServingError(f"disaggregation pins prefill and decode to their own cores: this "
                           f"process may use {len(cores)} core(s)")
    half = len(cores) // 2
    return tuple(cores[:half]), tuple(cores[half:])


def plan(base: EngineSpec, decode: str = "pop", prefill_cpus=None, decode_cpus=None,
         block_size: int = BLOCK_SIZE, kv_root: str | Path | None = None,
         proxy_port: int = 0, prefill_int8=()) -> Topology:
    """The topology for `base` (its model, skip set and variant go to the prefill instance);
    `prefill_int8`: layers whose Linears the prefill instance runs in int8 (its int8 copy is
    written once under the cache's models/ folder)."""
    if decode not in DECODE_SIDES:
        raise ServingError(f"the decode side is pop (the prefill's settings) or full (stock vLLM), "
                           f"not {decode!r}")
    if block_size < 32 or block_size % 32:
        raise ServingError(f"vLLM's CPU attention needs a block size that is a multiple of 32, "
                           f"got {block_size}")
    if prefill_cpus is None or decode_cpus is None:
        prefill_cpus, decode_cpus = split_cores()
    usable = os.sched_getaffinity(0)
    if not set(prefill_cpus) | set(decode_cpus) <= usable:
        raise ServingError(f"cores {sorted(set(prefill_cpus) | set(decode_cpus) - usable)} are not "
                           f"available here (this process may use {sorted(usable)})")
    if set(prefill_cpus) & set(decode_cpus):
        raise ServingError(f"prefill cores {list(prefill_cpus)} and decode cores "
                           f"{list(decode_cpus)} overlap: give each instance its own")
    prefill = base.setting
    int8_dir, weights = None, None
    if prefill_int8:
        int8_dir, prefill_int8 = int8_copy(base, prefill_int8)
        weights = kv_keys.weights_tag(int8_dir)
    folder = kv_keys.storage_dir(Path(kv_root or cache_dir() / "kv_transfer").resolve(), base.name,
                                 prefill, weights)

    def instance(spec: EngineSpec, role: str, engine_id: str, cpus) -> EngineSpec:
        cfg = json.dumps(kv_keys.transfer_config(role, folder, engine_id, prefill, weights),
                         separators=(",", ":"))
        return replace(spec, cpus=tuple(cpus), switchable=False, threads=len(cpus),
                       extra_args=("--block-size", str(block_size), "--kv-transfer-config", cfg))

    stock = replace(base, setting=RunSetting.full())
    return Topology(
        prefill=instance(replace(base, port=0, model_dir=str(int8_dir or base.model_dir)),
                         "kv_producer", "prefill-0", prefill_cpus),
        decode=instance(replace(base if decode == "pop" else stock, port=0), "kv_consumer",
                        "decode-0", decode_cpus),
        proxy=replace(stock, port=proxy_port, cpus=()),
        folder=str(folder), prefill_int8=tuple(prefill_int8))


def int8_copy(base: EngineSpec, layers) -> tuple[Path, tuple[int, ...]]:
    """The int8 copy of base's model for these layers ("kept": every layer the prefill does not
    skip), written once (checked first: layers in range, none of them skipped)."""
    from pop_analysis.serving.int8_checkpoint import write  # imports torch: only when asked

    config = json.loads((Path(base.model_dir) / "config.json").read_text(encoding="utf-8"))
    n = int(config.get("num_hidden_layers") or 0)
    if layers == KEPT:
        layers = [i for i in range(n) if i not in base.setting.skip]
    try:
        setting = replace(base.setting, precision=Precision(tuple(layers))).check(n)
    except ValueError as e:
        raise ServingError(str(e)) from None
    layers = setting.precision.int8
    tag = hashlib.sha256(f"{Path(base.model_dir).resolve()}|{list(layers)}".encode()).hexdigest()[:12]
    dst = cache_dir() / "models" / "int8" / f"{Path(base.model_dir).name}-w8a8-{tag}"
    if not (dst / "config.json").is_file():  # renamed when whole: a folder with it is complete
        tmp = dst.with_name(dst.name + ".partial")
        try:
            write(base.model_dir, tmp, layers)
            tmp.rename(dst)
        except OSError as e:
            raise ServingError(f"cannot write the int8 copy under {dst.parent}: "
                               f"{e.strerror or e}") from None
    return dst, layers


class Disaggregated:
    """The running topology: start() blocks until the proxy answers; stop() ends all three."""

    def __init__(self, topology: Topology, log_dir: Path | None = None):
        self.topology = topology
        self.prefill = Engine(topology.prefill, log_dir)
        self.decode = Engine(topology.decode, log_dir)
        self.proxy: Proxy | None = None
        self._log_dir = log_dir

    @property
    def url(self) -> str:
        return self.proxy.url

    def members(self) -> dict[str, Engine]:
        out = {"prefill": self.prefill, "decode": self.decode}
        return out if self.proxy is None else {**out, "proxy": self.proxy}

    def start(self, progress=None, timeout_s: float | None = None) -> "Disaggregated":
        """The two instances start side by side, each on its own cores (a start is mostly one
        core importing vLLM), then the proxy; the first failure stops all of them."""
        kw = {} if timeout_s is None else {"timeout_s": timeout_s}
        bar = _Progress(progress)
        waits = ThreadPoolExecutor(2, thread_name_prefix="instance-start")
        try:
            instances = (("prefill", self.prefill), ("decode", self.decode))
            for _, member in instances:
                member.launch(**kw)
            ready = [waits.submit(m.wait_ready, bar.part(name, i))
                     for i, (name, m) in enumerate(instances)]
            done, _ = wait(ready, return_when=FIRST_EXCEPTION)
            for f in ready:  # a failure, the prefill's before the decode's
                if f in done:
                    f.result()
            self.proxy = Proxy(self.topology.proxy, [self.prefill.url], [self.decode.url],
                               self._log_dir)
            self.proxy.start(progress=bar.part("proxy", 2), **kw)
        except BaseException:
            self.stop()  # a wait still under way ends when its engine has gone
            raise
        finally:
            waits.shutdown(wait=False)
        return self

    def check(self) -> None:
        """ServingError naming the member that died (one line)."""
        for name, member in self.members().items():
            try:
                member.check()
            except ServingError as e:
                raise ServingError(f"the {name} instance died: {e}") from None

    def alive(self) -> bool:
        return all(m.alive() for m in self.members().values())

    def info(self) -> dict:
        return {"url": f"{self.url}/v1", "topology": self.topology.describe(),
                "folder": self.topology.folder,
                "members": {name: {"url": m.url, "command": m.command_line, "pgid": m.proc.pid,
                                   "start_s": round(m.start_s or 0, 2), "log": str(m.log_path),
                                   "rss_mib": round(m.rss_bytes() / 2**20),
                                   "cores": list(m.spec.cpus)}
                            for name, m in self.members().items()}}

    def pids(self) -> list[int]:
        return [p for m in self.members().values() for p in m.pids()]

    def stop(self) -> None:
        for member in (self.proxy, self.decode, self.prefill):
            if member is not None:
                member.stop()

    def __enter__(self) -> "Disaggregated":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class _Progress:
    """The three members' progress(done, total, message) as one percentage (their shares summed:
    the instances start side by side), the message naming its member; one call at a time."""

    def __init__(self, progress):
        self.progress, self.shares, self.lock = progress, [0.0, 0.0, 0.0], threading.Lock()

    def part(self, name: str, index: int):
        if self.progress is None:
            return None

        def show(done, total, message):
            with self.lock:
                self.shares[index] = done / max(total, 1)
                self.progress(round(100 * sum(self.shares) / 3), 100, f"{name}: {message}")
        return show
