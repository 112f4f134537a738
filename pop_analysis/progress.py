"""Progress reporting for long runs: a callback the UI or the CLI plugs in.

A callback is `progress(update: Progress) -> None`; library loops call `tracker.step()`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    done: int  # units finished
    total: int  # units in all
    elapsed_s: float  # since the start
    message: str = ""  # what is running now

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta_s(self) -> float | None:
        if self.done <= 0 or self.total <= 0:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)


class Tracker:
    """Counts units and forwards a Progress to `callback` (if any) after each step."""

    def __init__(self, total: int, callback=None, message: str = ""):
        self.total, self.callback, self.message = total, callback, message
        self.done = 0
        self.t0 = time.perf_counter()
        self._emit()

    def step(self, n: int = 1, message: str | None = None) -> None:
        self.done += n
        if message is not None:
            self.message = message
        self._emit()

    def _emit(self) -> None:
        if self.callback is not None:
            self.callback(Progress(self.done, self.total, time.perf_counter() - self.t0, self.message))


def terminal_bar(update: Progress) -> None:
    """A one-line progress bar on stderr for the CLI."""
    width = 30
    filled = int(width * update.fraction)
    eta = f" ETA {update.eta_s:5.0f}s" if update.eta_s is not None else ""
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {update.done}/{update.total}"
                     f"{eta} {update.message[:40]:<40}")
    if update.done >= update.total:
        sys.stderr.write("\n")
    sys.stderr.flush()
