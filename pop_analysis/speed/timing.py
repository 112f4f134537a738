"""The one timing protocol behind every speed figure: full model vs a variant, side by side.

    warm-up (untimed, both) -> rounds of (full, variant) with the order swapped every round ->
    per-round ratio full/variant -> median, range, flags

k rounds: at least `min_rounds` (never fewer than 3), then more while the time budget lasts, up to
`max_rounds`. A lock (one acquisition per round) is waited for outside every timed interval; a
contended lock, a busy machine, rounds that disagree, or a ratio above what is possible mark the
result untrustworthy with a one-line reason. Everything that touches the outside world (clock,
lock, CPU probe) is injectable, so the arithmetic is tested with fake clocks.

The spread is the interquartile range (25th-75th percentile, linear interpolation) of the
per-round ratios, the robust companion of the median. On this project's shared 2-core machine a
single hiccup of another process slowed one run of a round by 10-20% (sometimes by seconds) while
the other rounds agreed within a few percent: the min-max range then moved by that hiccup and
flagged quiet measurements, the IQR and the median did not. With the minimum of 3 rounds the IQR is
half the range, so it still reacts to one round in three disagreeing. Min and max stay in the
record (`ratios`). Thresholds and the measurements behind them: docs/timing.md; results: docs/benchmarks.md.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pop_analysis.speed.procs import cpu_seconds, descendants

# Two speedup figures within 2% of each other tell the same story (medians_disagree).
MEDIANS_TOLERANCE = 0.02

MAX_ROUNDS = 50  # the most rounds anyone may ask for (beyond this, ask for a longer budget)
MAX_BUDGET_S = 3600.0  # the longest timing budget accepted
LOCK_WAIT_S = 1e-3  # a lock acquisition slower than this counts as contended


class TimingError(ValueError):
    """Timing parameters that cannot run (bad round count or budget); the message says why."""


@dataclass(frozen=True)
class TimingConfig:
    """How one full-vs-variant comparison is timed and judged."""

    min_rounds: int = 3  # fewest timed rounds (values below 3 are raised to 3)
    max_rounds: int = 15  # most rounds the budget may buy
    budget_s: float = 2.0  # seconds of timed rounds to aim for, beyond the minimum
    warmup: int = 1  # untimed rounds of both first (0: the caller has just run both)
    spread_limit: float = 0.10  # IQR / median of the per-round ratios above this: disagree
    busy_cores: float = 0.10  # other processes' CPU use (cores) beyond the idle ones: busy
    ideal_margin: float = 0.10  # a median above ideal * (1 + margin) is flagged

    def __post_init__(self):
        check_rounds(self.min_rounds)
        check_budget(self.budget_s)
        if self.warmup < 0 or self.warmup > MAX_ROUNDS:
            raise TimingError(f"warm-up rounds must lie in 0..{MAX_ROUNDS}, got {self.warmup}")
        if self.max_rounds < 1:
            raise TimingError(f"max_rounds must be at least 1, got {self.max_rounds}")

    @property
    def rounds_floor(self) -> int:
        return max(3, self.min_rounds)

    @property
    def rounds_cap(self) -> int:
        return max(self.rounds_floor, min(self.max_rounds, MAX_ROUNDS))


def check_rounds(rounds) -> int:
    """A requested round count, or TimingError (one line) when it is out of 1..MAX_ROUNDS."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise TimingError(f"timing rounds (repeats) must be an integer in 1..{MAX_ROUNDS}, "
                          f"got {rounds!r}")
    return rounds


def check_budget(budget_s) -> float:
    """A time budget in seconds, or TimingError when it is not in (0, MAX_BUDGET_S]."""
    try:
        ok = 0 < float(budget_s) <= MAX_BUDGET_S
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TimingError(f"the timing budget must be a number of seconds in (0, {MAX_BUDGET_S:g}], "
                          f"got {budget_s!r}")
    return float(budget_s)


@dataclass
class Timing:
    """What one comparison measured, and whether it can be shown as a plain number."""

    speedup: float  # median of the per-round ratios full / variant
    low: float  # 25th percentile of the per-round ratios
    high: float  # 75th percentile of the per-round ratios
    full_ms: list[float]  # full model, one time per round
    variant_ms: list[float]  # the variant, one time per round
    first: list[str]  # which side ran first in each round ("full" / "variant")
    trustworthy: bool  # False when any reason below applies
    note: str | None  # the reasons, one line; None when trustworthy
    lock_wait_s: float = 0.0  # time spent waiting for the lock (never inside a timed interval)
    lock_contended: bool = False  # another run held (or wanted) the model
    other_cores: float | None = None  # mean CPU cores used by other processes during the rounds
    ideal: float | None = None  # the bound the median was checked against
    reasons: list[str] = field(default_factory=list)  # one entry per flag

    @property
    def rounds(self) -> int:
        return len(self.full_ms)

    @property
    def ratios(self) -> list[float]:
        return [f / v for f, v in zip(self.full_ms, self.variant_ms)]

    @property
    def spread(self) -> float:
        """Relative spread of the per-round ratios: IQR / median."""
        return (self.high - self.low) / self.speedup

    @property
    def full_median_ms(self) -> float:
        return float(np.median(self.full_ms))

    @property
    def variant_median_ms(self) -> float:
        return float(np.median(self.variant_ms))

    def medians_disagree(self) -> str | None:
        """Why the median of the per-round ratios and the ratio of the two median times tell
        different stories (the latter outside the rounds' IQR, or on the other side of 1.0), or
        None. A page showing both figures must not show the first plain then."""
        of_medians = self.full_median_ms / self.variant_median_ms
        if abs(of_medians - self.speedup) <= MEDIANS_TOLERANCE * self.speedup:
            return None  # e.g. 1.34x against 1.36x: one story, however tight the rounds' IQR
        if (of_medians - 1) * (self.speedup - 1) < 0 or not self.low <= of_medians <= self.high:
            return (f"the median TTFTs give {of_medians:.2f}×, outside the rounds' IQR "
                    f"{self.low:.2f}–{self.high:.2f}×")
        return None

    def fields(self) -> dict:
        """The keys every CLI row carries (the contract in the README)."""
        return {"speedup_range": [round(self.low, 4), round(self.high, 4)],
                "timing_rounds": self.rounds, "timing_trustworthy": self.trustworthy,
                "timing_note": self.note}


# ---------------------------------------------------------------- the machine's other work


def other_cpu_seconds() -> float | None:
    """CPU seconds all processes but this one have used since boot (None off Linux).

    Busy time of every CPU from /proc/stat (user, nice, system, irq, softirq, and steal: time the
    hypervisor gave to someone else) minus this process's own CPU time. While our threads run,
    the load average mostly counts them; this counts only the others.
    """
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
        ticks = [int(x) for x in parts[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return busy - time.process_time()


def other_cpu_seconds_but_ours() -> float | None:
    """As other_cpu_seconds, less the processes this one started: an engine's worker processes
    (vLLM runs its model in a child process) are our work, not another's."""
    other = other_cpu_seconds()
    return None if other is None else other - cpu_seconds(descendants())


def _threads() -> int:
    try:
        import torch

        return torch.get_num_threads()
    except ImportError:
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Machine:
    """Everything a timing reads from the world outside the two functions it compares; tests
    inject fakes.

    clock: seconds, synchronised with the device (see bench.device_clock).
    lock: a factory of context managers held for each round (warm-up included); the time to
      enter it is never timed. If what it yields has a true `contended` attribute after the
      round, or entering took over LOCK_WAIT_S, another run held the model.
    probe: cumulative CPU seconds of other processes (None: unknown), read around the rounds.
    threads / cpus: our compute threads and the machine's CPUs (cores left idle by us may be
      used by others without competing); None: torch's threads, os.cpu_count().
    """

    clock: Callable[[], float] = time.perf_counter
    lock: Callable | None = None
    probe: Callable[[], float | None] | None = other_cpu_seconds
    threads: int | None = None
    cpus: int | None = None


@dataclass(frozen=True)
class Contention:
    """What competed with the timed rounds: other processes and the lock."""

    other_cores: float | None  # mean CPU cores other processes used during the rounds (None: unknown)
    threads: int  # our compute threads
    cpus: int  # the machine's CPUs
    lock_wait_s: float = 0.0  # time spent waiting for the lock (never inside a timed interval)
    lock_contended: bool = False  # another run held (or wanted) the model


# ---------------------------------------------------------------- the protocol


def measure(full, variant, cfg: TimingConfig = TimingConfig(), *, machine: Machine = Machine(),
            ideal: float | None = None, on_round=None) -> Timing:
    """Time `full()` against `variant()` with the protocol above; returns a Timing.

    machine: the clock, lock, CPU probe and core counts (see Machine).
    ideal: the largest speedup that is possible here; a median above it by more than
      cfg.ideal_margin is flagged.
    on_round(done, planned): after each timed round, for progress displays.
    """
    clock, probe = machine.clock, machine.probe
    run = _Runner(full, variant, clock, machine.lock)
    for r in range(cfg.warmup):
        run.round(r % 2 == 1, timed=False)
    before, t0 = (probe() if probe else None), clock()
    while run.rounds < cfg.rounds_cap:
        if run.rounds >= cfg.rounds_floor and run.timed_s + run.mean_round_s > cfg.budget_s:
            break
        run.round(run.rounds % 2 == 1)
        if on_round:
            on_round(run.rounds, _planned(run, cfg))
    wall = clock() - t0
    after = probe() if probe else None
    other = None if before is None or after is None or wall <= 0 else max(0.0, after - before) / wall
    threads = machine.threads if machine.threads is not None else _threads()
    cpus = machine.cpus if machine.cpus is not None else (os.cpu_count() or 1)
    return judge(run.times["full"], run.times["variant"], run.first, cfg,
                 Contention(other, threads, cpus, run.lock_wait_s, run.contended), ideal)


def _planned(run, cfg) -> int:
    """Rounds the budget is expected to buy, for progress displays."""
    if run.mean_round_s <= 0:
        return cfg.rounds_cap
    fit = int(cfg.budget_s / run.mean_round_s)
    return max(run.rounds, min(cfg.rounds_cap, max(cfg.rounds_floor, fit)))


class _Runner:
    """Runs rounds and keeps their times; lock waits are measured but never timed."""

    def __init__(self, full, variant, clock, lock):
        self.fns = {"full": full, "variant": variant}
        self.clock, self.lock = clock, lock
        self.times = {"full": [], "variant": []}
        self.first: list[str] = []
        self.timed_s = 0.0
        self.lock_wait_s = 0.0
        self.contended = False

    @property
    def rounds(self) -> int:
        return len(self.first)

    @property
    def mean_round_s(self) -> float:
        return self.timed_s / self.rounds if self.rounds else 0.0

    def round(self, variant_first: bool, timed: bool = True) -> None:
        order = ("variant", "full") if variant_first else ("full", "variant")
        if self.lock is None:
            got = self._both(order)
        else:
            t_wait = self.clock()
            with self.lock() as held:
                waited = self.clock() - t_wait  # never inside a timed interval
                got = self._both(order)
            self.lock_wait_s += waited
            self.contended |= waited > LOCK_WAIT_S or bool(getattr(held, "contended", False))
        if timed:
            for side in order:
                self.times[side].append(got[side])
            self.first.append(order[0])
            self.timed_s += got["full"] + got["variant"]

    def _both(self, order) -> dict:
        got = {}
        for side in order:
            t0 = self.clock()
            self.fns[side]()
            got[side] = self.clock() - t0
        return got


def judge(full: list[float], var: list[float], first: list[str], cfg: TimingConfig,
          load: Contention, ideal: float | None = None) -> Timing:
    """The protocol's verdict on per-round values measured elsewhere (seconds, smaller is
    better; e.g. the median TTFT of one load test per round): median and IQR of the per-round
    ratios full/variant, and the flags. measure() ends here too."""
    other, threads, cpus = load.other_cores, load.threads, load.cpus
    lock_wait_s, contended = load.lock_wait_s, load.lock_contended
    ratios = [f / v if v > 0 else float("inf") for f, v in zip(full, var)]
    med = float(np.median(ratios))
    low, high = (float(q) for q in np.percentile(ratios, [25, 75]))
    reasons = []
    spread = (high - low) / med if med > 0 else float("inf")
    if spread > cfg.spread_limit:
        reasons.append(f"rounds disagree (IQR {low:.2f}-{high:.2f}x is {spread:.0%} of the "
                       f"median, over {cfg.spread_limit:.0%})")
    idle = max(0, cpus - threads)
    if other is not None and other - idle > cfg.busy_cores:
        reasons.append(f"machine busy (other processes used {other:.1f} CPU cores; "
                       f"{threads} threads on {cpus} cores)")
    if contended:
        reasons.append(f"another run held the model (waited {lock_wait_s:.1f} s, not counted)")
    if ideal is not None and med > ideal * (1 + cfg.ideal_margin):
        reasons.append(f"{med:.2f}x is more than {cfg.ideal_margin:.0%} above the ideal "
                       f"{ideal:.2f}x")
    return Timing(speedup=med, low=low, high=high, full_ms=[t * 1e3 for t in full],
                  variant_ms=[t * 1e3 for t in var], first=list(first),
                  trustworthy=not reasons, note="; ".join(reasons) or None,
                  lock_wait_s=lock_wait_s, lock_contended=contended, other_cores=other,
                  ideal=ideal, reasons=reasons)
