"""This machine's matmul rates and memory bandwidth, measured once and cached, for the roofline.

About a second of measurement per (CPU model, threads, dtype, device, weight shape), kept in
cache/machine/rates.json. The matmul rate is measured at several row counts on weights of the
model's FFN shape (hidden x intermediate), cycling through more of them than the caches hold, as a
model's layers meet their weights: a CPU's kernels reach a fraction of their peak on a 32-row
matmul, so one peak number would call a 32-token prefill compute-bound at a speed no
implementation here attains. The bandwidth is the best of streaming a buffer far larger than the
last-level cache (a read-only sum, and a copy counted as read + write). Rates measured while other
processes used the CPU are not kept: on this project's shared machine a busy measurement read a
quarter of the quiet bandwidth, and cached, it made every later roofline ideal wrong (Gemma's
short prompts: 1.00x, where the quiet rates give the 1.2-1.3x the run reaches).
"""
from __future__ import annotations

import bisect
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass

from pop_analysis.store.paths import cache_dir

ROWS = (1, 4, 16, 64, 256, 1024, 4096)  # matmul row counts measured (batch x tokens)


@dataclass(frozen=True)
class Rates:
    """Measured rates of one (CPU, threads, dtype, device, weight shape)."""

    rows: tuple[int, ...]  # row counts of the matmul measurements, ascending
    flops_per_s: tuple[float, ...]  # best matmul rate at each row count
    bytes_per_s: float  # best streaming memory bandwidth
    key: str  # what they were measured for
    measured_at: float = 0.0  # unix time
    busy: bool = False  # other processes competed during the measurement (not cached)

    def flops_at(self, rows: int) -> float:
        """Matmul rate at `rows` rows: log-linear between measured counts, clamped at the ends."""
        if rows <= self.rows[0]:
            return self.flops_per_s[0]
        if rows >= self.rows[-1]:
            return self.flops_per_s[-1]
        j = bisect.bisect_left(self.rows, rows)
        lo, hi = self.rows[j - 1], self.rows[j]
        w = (math.log(rows) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return self.flops_per_s[j - 1] * (1 - w) + self.flops_per_s[j] * w

    @property
    def peak_flops_per_s(self) -> float:
        return max(self.flops_per_s)


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


INT8_ISA = ("amx_int8", "avx512_vnni", "avx_vnni")  # CPU features int8 matrix kernels use


def int8_isa() -> list[str]:
    """Which of INT8_ISA this CPU has: whether int8 products have a fast path here (without
    them, torch's int8 matmul on CPU ran 17-50x slower than fp32; docs/precision.md)."""
    have = set((_cpuinfo("flags") or "").split())
    return [x for x in INT8_ISA if x in have]


def rates_key(device, dtype, threads: int, shape: tuple[int, int]) -> str:
    import torch

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return (f"{cpu_model()} | {threads} threads | {str(dtype).replace('torch.', '')} | {name} | "
            f"weight {shape[0]}x{shape[1]} | cold")


def _path():
    return cache_dir() / "machine" / "rates.json"


def _read_all() -> dict:
    try:
        with open(_path(), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_all(data: dict) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".rates.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _from_entry(entry, key: str) -> Rates | None:
    try:
        rows, flops = tuple(int(r) for r in entry["rows"]), tuple(float(x) for x in entry["flops_per_s"])
        bw = float(entry["bytes_per_s"])
    except (KeyError, TypeError, ValueError):
        return None
    ok = len(rows) == len(flops) > 0 and min(flops) > 0 and bw > 0 and list(rows) == sorted(rows)
    return Rates(rows, flops, bw, key, float(entry.get("measured_at", 0))) if ok else None


def machine_rates(device="cpu", dtype=None, threads: int | None = None,
                  shape: tuple[int, int] = (1024, 4096), refresh: bool = False) -> Rates:
    """The cached rates for this machine, setting and weight shape (hidden, intermediate),
    measuring them on the first call (or when `refresh`)."""
    import torch

    dtype = dtype or torch.float32
    threads = threads or torch.get_num_threads()
    key = rates_key(device, dtype, threads, shape)
    hit = None if refresh else _from_entry(_read_all().get(key), key)
    if hit is not None:
        return hit
    before, t0 = _others(), time.perf_counter()
    flops = tuple(matmul_rate(device, dtype, shape, r) for r in ROWS)
    bw = bandwidth(device)
    after, wall = _others(), time.perf_counter() - t0
    busy = None not in (before, after) and (after - before) / max(wall, 1e-9) > BUSY_CORES
    rates = Rates(ROWS, flops, bw, key, time.time(), busy)
    if busy:  # another process's work in these rates would stay in every roofline: measure again
        return rates
    data = _read_all()
    data[key] = {"rows": list(rates.rows), "flops_per_s": list(rates.flops_per_s),
                 "bytes_per_s": rates.bytes_per_s, "measured_at": rates.measured_at}
    try:
        _write_all(data)
    except OSError:
        pass  # a read-only cache: measure again next time
    return rates


BUSY_CORES = 0.5  # other processes' CPU use (cores) during a measurement that spoils it


def _others() -> float | None:
    from pop_analysis.speed.timing import other_cpu_seconds

    return other_cpu_seconds()


def _best(fn, device, min_s: float, reps: int = 3) -> float:
    """Fastest of at least `reps` calls, calling for at least min_s seconds (at most 200 calls)."""
    from pop_analysis.engine.generate import synchronize

    fn()  # warm-up: first-call allocations and kernel selection
    best, spent, done = float("inf"), 0.0, 0
    while (done < reps or spent < min_s) and done < 200:
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        dt = time.perf_counter() - t0
        best, spent, done = min(best, dt), spent + dt, done + 1
    return best


COLD_BYTES = 128 * 2 ** 20  # weights cycled through per matmul measurement: beyond any cache


def matmul_rate(device, dtype, shape: tuple[int, int], rows: int, min_s: float = 0.05) -> float:
    """FLOP/s of (rows, hidden) @ (hidden, intermediate)^T, as a linear layer runs it: each call
    on the next of several weights that together exceed the caches. A model's layers never find
    their weights in cache; one weight timed again and again does (a 640 x 2048 fp32 weight is 5
    MB), and read 2-4x the rate a layer gets at 1-16 rows on this project's machine."""
    import torch

    dev = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(shape[1], shape[0], generator=g).to(device=dev, dtype=dtype)  # (I, D)
    copies = max(1, -(-COLD_BYTES // (w.numel() * w.element_size())))
    ws = [w] + [w.clone() for _ in range(copies - 1)]  # COLD_BYTES of weights, (I, D) each
    x = torch.randn(rows, shape[0], generator=g).to(device=dev, dtype=dtype)  # (M, D)
    turn = [0]

    def call():
        turn[0] += 1
        return torch.nn.functional.linear(x, ws[turn[0] % copies])  # (M, I)

    with torch.inference_mode():
        dt = _best(call, dev, min_s)
    return 2.0 * rows * shape[0] * shape[1] / dt


def bandwidth(device, mib: int | None = None, min_s: float = 0.15) -> float:
    """Bytes/s streaming a buffer of `mib` MiB (256 on CPU, 2048 on GPU): best of sum and copy."""
    import torch

    dev = torch.device(device)
    size = (mib or (2048 if dev.type == "cuda" else 256)) * 2**20
    src = torch.ones(size // 4, device=dev)  # (size/4,) float32
    dst = torch.empty_like(src)
    read = size / _best(lambda: src.sum(), dev, min_s)
    copy = 2 * size / _best(lambda: dst.copy_(src), dev, min_s)
    return max(read, copy)
