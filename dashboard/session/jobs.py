"""Long runs on a worker thread: the page stays live while they run, a Cancel button stops them
at their next progress step and keeps what finished, and the bar shows the time left estimated
from measured progress (pop_analysis.progress).

A page starts a run with `start(name, label, fn, on_done)`; `fn(progress)` runs under the model's
run lock and returns the result (pass `notice=progress.notice` to the library: its notices are
shown under the outcome); `on_done(job)` runs later in a script run of the same session
(app.py calls `collect()` before every page) and files the result where the pages read it.
`panel(name)` draws the live bar and the Cancel button (a fragment that refreshes every second)
or the outcome of the last run in plain words.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import streamlit as st

from dashboard.session import state
from dashboard.session.resources import locked
from pop_analysis.errors import first_line
from pop_analysis.progress import Cancelled, Monitor, describe_eta, duration

JOBS = "lab.jobs"  # name -> Job, the runs of this session
NOTE = "lab.note."  # + name: (level, text) outcome of the last run, shown by panel()
REFRESH_S = 1.0  # the live bar redraws this often


@dataclass
class Job:
    name: str  # which run ("calibrate", "sweep", "drift", "drift_length")
    label: str  # what the bar says ("Calibrating built-in prompts")
    on_done: Callable  # on_done(job) -> (level, text): files the result, says what happened
    monitor: Monitor = field(default_factory=Monitor)
    result: Any = None  # fn's return value
    cancelled: Cancelled | None = None  # set when the run was cancelled (partial inside)
    error: BaseException | None = None  # set when the run failed
    waiting: bool = False  # True while another session holds the model
    seconds: float | None = None  # wall time once finished
    thread: threading.Thread | None = None
    context: dict = field(default_factory=dict)  # the settings it was started with
    model: str | None = None  # the model it runs on: its result is that model's

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def partial(self):
        return self.cancelled.partial if self.cancelled is not None else None


def jobs() -> dict:
    return st.session_state.setdefault(JOBS, {})


def get(name: str) -> Job | None:
    return jobs().get(name)


def running(name: str) -> bool:
    job = get(name)
    return job is not None and job.running


def start(name: str, label: str, fn: Callable, on_done: Callable, context: dict | None = None) -> Job:
    """Run fn(progress) on a worker thread under the model's run lock; returns the Job."""
    key = state.model_spec().key
    job = Job(name, label, on_done, context=dict(context or {}), model=key[0])

    def wait() -> None:
        job.waiting = True

    def work() -> None:
        t0 = time.perf_counter()
        try:
            with locked(*key, on_wait=wait):
                job.waiting = False
                job.result = fn(job.monitor)
        except Cancelled as c:
            job.cancelled = c
        except BaseException as e:  # noqa: BLE001 - shown to the user by on_done / panel
            job.error = e
        finally:
            job.seconds = time.perf_counter() - t0

    job.thread = threading.Thread(target=work, name=f"poplab-{name}", daemon=True)
    jobs()[name] = job
    st.session_state.pop(NOTE + name, None)
    job.thread.start()
    job.thread.join(0.3)  # a stored result comes back at once: show it in this run
    collect()
    return job


def cancel(name: str) -> None:
    job = get(name)
    if job is not None:
        job.monitor.cancel()


def collect() -> None:
    """File the results of finished runs (their on_done) and keep their outcome notes."""
    for name, job in list(jobs().items()):
        if job.running:
            continue
        del jobs()[name]
        try:
            level, text = job.on_done(job)
        except Exception as e:  # noqa: BLE001 - a filing error must not break every page
            level, text = "error", f"{job.label}: could not keep the result: {e}"
        st.session_state[NOTE + name] = (level, text, tuple(job.monitor.notices), job.model)


def panel(name: str) -> None:
    """The live bar with a Cancel button while `name` runs, else the last run's outcome."""
    if running(name):
        _live(name)
        return
    note = st.session_state.get(NOTE + name)
    # another model's outcome (a run before a model switch) is not this page's
    if note and note[3:] in ((), (state.model_spec().name,)):
        level, text, notices = note[:3]
        getattr(st, level)(text)
        for line in notices:
            st.warning(line)


@st.fragment(run_every=REFRESH_S)
def _live(name: str) -> None:
    job = get(name)
    if job is None or not job.running:
        st.rerun()  # the whole page: collect() files the result
    bar, button = st.columns([6, 1], vertical_alignment="center")
    bar.progress(fraction(job), text=status(job))
    button.button("Cancel", key=f"cancel.{name}", on_click=cancel, args=(name,),
                  disabled=job.monitor.cancelled, help="stop at the next step; finished work is kept")


def fraction(job: Job) -> float:
    """How far the run is: by time once the rest can be estimated, by units before."""
    p, elapsed, eta = job.monitor.snapshot()
    if p is None:
        return 0.0
    if eta is None:
        return min(max(p.fraction, 0.0), 1.0)
    return min(max(elapsed / (elapsed + eta), 0.0), 1.0) if elapsed + eta > 0 else 1.0


def status(job: Job) -> str:
    """One line in plain words: what runs, how far, how long so far, the time left."""
    p, elapsed, eta = job.monitor.snapshot()
    if job.waiting:
        return f"{job.label}: waiting for another session to finish with the model ..."
    if job.monitor.cancelled:
        return f"{job.label}: stopping at the next step ..."
    text = f"{job.label}: {duration(elapsed)} so far"
    if p is not None:
        text += f" · {describe_eta(eta, p.unmeasured)}"
        if p.message:
            text += f" · now: {p.message}"
    return text


def running_summary() -> list[str]:
    """One line per run in progress (for the sidebar)."""
    return [f"{job.label}: {fraction(job):.0%}" for job in jobs().values() if job.running]


def outcome(job: Job, key: str, what: str, oom_hint: str, finished, done) -> tuple[str, str]:
    """The usual on_done: keep the result under `key` (for a cancelled run, what finished,
    marked partial) and say what happened in plain words.

    finished(partial) names what a cancelled run kept ("4 of 8 samples"); done(result) says
    what a computed run did ("8 samples in 12 s").
    """
    if job.cancelled is not None:
        part = job.partial
        if not part:
            return "warning", f"{what}: cancelled after {duration(job.seconds)}; nothing had finished."
        kept = finished(part)
        state.keep_result(key, part, {**job.context,
                                      "partial": f"cancelled; {kept} finished (not stored)"},
                          job.model)
        return "warning", (f"{what}: cancelled after {duration(job.seconds)}; showing the {kept} "
                           "that finished (not stored).")
    if job.error is not None:
        import torch

        if isinstance(job.error, torch.OutOfMemoryError):
            return "error", f"{what}: out of memory; {oom_hint}"
        return "error", f"{what} failed: {first_line(job.error)}"
    result, hit = job.result
    state.keep_result(key, result, job.context, job.model)
    if hit:
        return "success", f"{what}: loaded from the results store."
    return "success", f"{what}: {done(result)}; stored for next time."
