"""Progress reporting, ETA and cancellation for long runs: a callback the UI or the CLI plugs in.

A callback is `progress(update: Progress) -> None`; library loops call `tracker.step()`.

ETA. Units of one run rarely cost the same (a sweep's timing round costs ten greedy items; the
first decode step of a 2048-token drift run holds its prefill), so a plain elapsed/done * left
goes wrong by a factor of ten. An engine that knows its structure declares a `plan`: the cost
weight of each kind of work ({"reference": 8, "quality": 48, "timing": 6}, or weights in tokens);
each counted step names its kind and weight. The tracker measures seconds per weight for each
kind and sums what is left. It gives no number until it can estimate: while a kind with work
ahead has not been measured, `remaining_s` is None and the kind is named in
`Progress.unmeasured` (the UI says "estimating"). The run's first counted step carries its
one-time costs (a first batch, kernels chosen, caches grown): its kind is measured from its
second step on, without it. A number that leaves out work ahead read "under a second" and then jumped to minutes;
one first step taken as the rate read "26 min" for a run that took 87 s. Without a plan the
estimate uses the rate of the most recent units, from the second unit on.

Cancellation. A callback object with a `cancel_event` (a threading.Event, see `Monitor`) stops
the run at the next `tracker.step()`: the step raises `Cancelled`. Engines that can keep what
finished catch it and re-raise it with `partial` set (rows done so far, a result over the
finished samples); the rest simply stop.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

RECENT = 5  # units in the recent-rate window (no plan)


class Cancelled(Exception):
    """The run was stopped on request; `partial` holds what finished (None: nothing usable)."""

    def __init__(self, message: str = "cancelled", partial=None, done: int = 0, total: int = 0):
        super().__init__(message)
        self.partial = partial  # engine-specific: rows so far, a result over finished samples
        self.done, self.total = done, total  # units finished when it stopped

    def keep(self, partial) -> "Cancelled":
        """The same cancellation carrying `partial` (engines re-raise it from their loops)."""
        self.partial = partial
        return self


@dataclass(frozen=True)
class Progress:
    done: int  # units finished
    total: int  # units in all
    elapsed_s: float  # since the start
    message: str = ""  # what is running now
    remaining_s: float | None = None  # estimate from measured unit costs; None: nothing measured
    unmeasured: tuple[str, ...] = ()  # kinds of work ahead whose cost is not measured yet

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left when this update was made (None until the work ahead can be estimated)."""
        return self.remaining_s

    @property
    def time_fraction(self) -> float:
        """How far the run is by time (elapsed / expected), or by units before an estimate."""
        if self.remaining_s is None:
            return self.fraction
        total = self.elapsed_s + self.remaining_s
        return self.elapsed_s / total if total > 0 else 1.0


class Tracker:
    """Counts units, estimates the time left, forwards a Progress to `callback` after each step
    and raises Cancelled at a step once the callback's `cancel_event` is set."""

    def __init__(self, total: int, callback=None, message: str = "", plan: dict | None = None,
                 cancel=None):
        self.total, self.callback, self.message = total, callback, message
        self.plan = {k: float(w) for k, w in (plan or {}).items()}  # kind -> weight in all
        self.cancel = cancel if cancel is not None else getattr(callback, "cancel_event", None)
        self.done = 0
        self.t0 = self.last = time.perf_counter()  # start; time of the last counted step
        # kind -> [weight done, seconds spent, steps, weight and seconds of its first step,
        # whether that step was the run's first (it then carries the run's one-time costs)]
        self.spent: dict[str, list] = {}
        self.counted = 0  # steps of any kind counted so far
        self.recent: deque = deque(maxlen=RECENT)  # (units, seconds) of the latest counted steps
        self._emit()

    def step(self, n: int = 1, message: str | None = None, kind: str | None = None,
             weight: float | None = None) -> None:
        """Count n units (0: only a new message) of `kind` costing `weight` (default n)."""
        self.check()
        now = time.perf_counter()
        if message is not None:
            self.message = message
        if n or weight:
            seconds, self.last = now - self.last, now
            self.done += n
            w = float(n if weight is None else weight)
            if kind is not None and w > 0:
                acc = self.spent.setdefault(kind, [0.0, 0.0, 0, w, seconds, not self.counted])
                acc[0] += w
                acc[1] += seconds
                acc[2] += 1
                self.counted += 1
            if n:
                self.recent.append((n, seconds))
        self._emit()

    def costed(self, kind: str, per_unit: float) -> "Costed":
        """A view of this tracker whose counted steps are `kind` work costing `per_unit` each
        (for helpers that only call step(n, message))."""
        return Costed(self, kind, per_unit)

    def check(self) -> None:
        """Raise Cancelled when cancellation was asked for."""
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled(f"cancelled after {self.done}/{self.total} {self.message}".strip(),
                            done=self.done, total=self.total)

    def remaining(self) -> tuple[float | None, tuple[str, ...]]:
        """(seconds left by measured rates, kinds still ahead that have no measured rate)."""
        if self.plan:
            left, unknown = 0.0, []
            for kind, total in self.plan.items():
                w_done, secs, steps, w1, s1, warm = self.spent.get(kind, (0, 0, 0, 0, 0, False))
                ahead = max(total - w_done, 0.0)
                if ahead <= 0:
                    continue
                if warm and steps >= 2 and w_done > w1:
                    left += ahead * (secs - s1) / (w_done - w1)  # the run's first step left out
                elif not warm and steps >= 1:
                    left += ahead * secs / w_done
                else:
                    unknown.append(kind)
            return (None if unknown else left), tuple(unknown)
        recent = list(self.recent)[1:] if self.done == sum(u for u, _ in self.recent) else \
            list(self.recent)  # the run's first unit is left out of the rate
        units = sum(u for u, _ in recent)
        if not units:
            return None, ()
        return (self.total - self.done) * sum(s for _, s in recent) / units, ()

    def _emit(self) -> None:
        if self.callback is not None:
            left, unknown = self.remaining()
            self.callback(Progress(self.done, self.total, time.perf_counter() - self.t0,
                                   self.message, left, unknown))


class Costed:
    """Tracker.costed's view: step(n, message) counts n units of one kind of work."""

    def __init__(self, tracker: Tracker, kind: str, per_unit: float):
        self.tracker, self.kind, self.per_unit = tracker, kind, per_unit

    def step(self, n: int = 1, message: str | None = None) -> None:
        self.tracker.step(n, message, kind=self.kind, weight=n * self.per_unit)


@contextmanager
def keeping(partial):
    """Inside the block a cancellation is re-raised carrying `partial()`: what finished."""
    try:
        yield
    except Cancelled as c:
        raise c.keep(partial()) from None


class Monitor:
    """A progress callback for a run on another thread: keeps the latest Progress and when it
    came, holds the cancel flag the run's Tracker checks, and collects the run's notices (one
    line each: an ignored stored entry, a result that could not be stored). Thread-safe; no UI."""

    def __init__(self):
        self.cancel_event = threading.Event()
        self.started = time.perf_counter()
        self.updates = 0  # Progress updates received
        self._lock = threading.Lock()
        self._last: Progress | None = None
        self._at = self.started  # when the last update arrived
        self.notices: list[str] = []  # lines the run wants the user to read

    def __call__(self, update: Progress) -> None:
        with self._lock:
            self._last, self._at = update, time.perf_counter()
            self.updates += 1

    def notice(self, line: str) -> None:
        """The run's `notice` callback: kept for the page to show."""
        with self._lock:
            self.notices.append(line)

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def snapshot(self) -> tuple[Progress | None, float, float | None]:
        """(latest Progress, seconds since the start, seconds left now): the estimate counts
        down between updates and never below zero."""
        with self._lock:
            p, at = self._last, self._at
        now = time.perf_counter()
        eta = None
        if p is not None and p.eta_s is not None:
            eta = max(p.eta_s - (now - at), 0.0)
        return p, now - self.started, eta


def describe_eta(eta_s: float | None, unmeasured: tuple[str, ...] = ()) -> str:
    """Plain words for an estimate: 'about 2 min 5 s left', or 'estimating (timing the
    sampling)' while some work ahead has not been measured."""
    if eta_s is None:
        what = f" (timing the {' and '.join(unmeasured)})" if unmeasured else ""
        return f"estimating the time left{what} ..."
    return f"{'under a second' if eta_s < 1 else 'about ' + duration(eta_s)} left"


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


_BAR_OPEN = threading.Event()  # set while the bar's line on stderr awaits its newline


def end_line() -> None:
    """End the progress bar's line, so a message printed next starts a line of its own."""
    if _BAR_OPEN.is_set():
        _BAR_OPEN.clear()
        sys.stderr.write("\n")
        sys.stderr.flush()


def terminal_bar(update: Progress) -> None:
    """A one-line progress bar on stderr for the CLI."""
    width = 30
    filled = int(width * update.time_fraction)
    eta = f" ETA {update.eta_s:5.0f}s" if update.eta_s is not None else " ETA ..."
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {update.done}/{update.total}"
                     f"{eta} {update.message[:40]:<40}")
    if update.done >= update.total:
        sys.stderr.write("\n")
        _BAR_OPEN.clear()
    else:
        _BAR_OPEN.set()
    sys.stderr.flush()
