"""Waiting for a quiet machine before a timing that will be kept (the stored examples): the
timing protocol flags a measurement taken while other processes use more than
`TimingConfig.busy_cores` beyond the cores we leave idle, so a recorder waits for such a window
first instead of measuring into a flag it knows will come."""
from __future__ import annotations

import os
import time

from pop_analysis.speed.timing import TimingConfig, other_cpu_seconds


def other_cores(window_s: float, probe=other_cpu_seconds, clock=time.monotonic,
                sleep=time.sleep) -> float | None:
    """Mean CPU cores other processes used over the next `window_s` seconds (None: unknown)."""
    before, t0 = probe(), clock()
    sleep(window_s)
    after, wall = probe(), clock() - t0
    if before is None or after is None or wall <= 0:
        return None
    return max(0.0, after - before) / wall


def wait_quiet(max_wait_s: float, threads: int, cfg: TimingConfig = TimingConfig(),
               window_s: float = 2.0, cpus: int | None = None, probe=other_cpu_seconds,
               clock=time.monotonic, sleep=time.sleep) -> tuple[bool, float | None]:
    """Poll until other processes' use over one window stays within what the protocol calls
    quiet, or `max_wait_s` has passed: (quiet, the last window's other cores)."""
    idle = max(0, (cpus or os.cpu_count() or 1) - threads)
    deadline = clock() + max_wait_s
    last = None
    while True:
        last = other_cores(window_s, probe, clock, sleep)
        if last is None or last - idle <= cfg.busy_cores:
            return last is not None, last
        if clock() >= deadline:
            return False, last
