"""One model instance per (name, device, dtype), shared by every page and session, loaded on a
thread of its own: pages draw what needs no model (text, stored examples) while it loads.

Nothing here imports torch at module level: the first page's text and charts must not wait for
torch and transformers to import (seconds on a busy machine); the loading thread imports them.
"""
from __future__ import annotations

import gc
import os
import threading
import time
from contextlib import contextmanager

import streamlit as st

from pop_analysis.data.allowed_paths import check_model


@st.cache_resource(show_spinner=False)
def load_log() -> list:
    """(name, device, dtype, wall time) of every real load in this server: proves page switches
    and reruns reuse the instance (the sidebar shows the count; tests read it)."""
    return []


class Loading:
    """One model's load on a background thread; `wait()` gives the model or raises its error."""

    def __init__(self, name: str, device: str | None, dtype: str | None):
        self.name, self.started = name, time.time()
        self.model = self.error = None
        self.thread = threading.Thread(target=self._load, args=(name, device, dtype),
                                       name=f"poplab-load-{name}", daemon=True)
        self.thread.start()

    def _load(self, name, device, dtype) -> None:
        try:
            check_model(name)  # the allowed-path rule: a link, the model box, the pages all end here
            from pop_analysis.engine.models import load_model

            self.model = load_model(name, device=device, dtype=dtype)
            load_log().append((name, device, dtype, time.time()))
        except BaseException as e:  # noqa: BLE001 - raised again by wait(), where it is shown
            self.error = e

    @property
    def ready(self) -> bool:
        return not self.thread.is_alive()

    def wait(self, timeout: float | None = None):
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.model


_STARTED: set[tuple] = set()  # specs whose load has been asked for (loading() entries)


@st.cache_resource(show_spinner=False, max_entries=2)
def loading(name: str, device: str | None, dtype: str | None) -> Loading:
    """The load of (name, device, dtype), started by the first page or session that asks."""
    _STARTED.add((name, device, dtype))
    return Loading(name, device, dtype)


def started(name: str, device: str | None, dtype: str | None) -> Loading | None:
    """The load of that spec if one was asked for, without starting one: the sidebar must not
    start a load (its imports compete with the first page for the interpreter) before the
    page has drawn what needs no model; pages start it (widgets.model_or_stop)."""
    return loading(name, device, dtype) if (name, device, dtype) in _STARTED else None


def shared_model(name: str, device: str | None, dtype: str | None):
    """The shared instance, loaded once (waits for a load under way); raises the load's error."""
    lo = loading(name, device, dtype)
    try:
        return lo.wait()
    except BaseException:
        loading.clear(name, device, dtype)
        raise


class Held:
    """What holding the run lock yields: whether another run held or wanted the model."""

    contended = False  # True once another run held the lock first or queued for it meanwhile


class RunLock:
    """A model's run lock that knows when it was contended (the timing protocol flags that).

    Timing takes it once per round (pop_analysis.speed.timing): the wait is never inside a timed
    interval, and a round during which another session queued is flagged too.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self.waiting = 0  # runs blocked on the lock right now

    @contextmanager
    def hold(self, on_wait=None):
        held = Held()
        if not self._lock.acquire(blocking=False):
            held.contended = True
            with self._count:
                self.waiting += 1
            try:
                if on_wait is not None:
                    on_wait()
                self._lock.acquire()
            finally:
                with self._count:
                    self.waiting -= 1
        try:
            yield held
        finally:
            held.contended = held.contended or self.waiting > 0
            self._lock.release()


@st.cache_resource(show_spinner=False)
def model_lock(name: str, device: str | None, dtype: str | None) -> RunLock:
    """Serialises runs on one model so two sessions never interleave inside it."""
    return RunLock()


def unload_models() -> None:
    """Drop every shared model (all sessions) and give the memory back."""
    loading.clear()
    _STARTED.clear()
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort
        pass


def locked(name: str, device: str | None, dtype: str | None, on_wait=None):
    """Hold the model's run lock (a context manager yielding a Held); `on_wait()` is called once
    if another session holds it."""
    return model_lock(name, device, dtype).hold(on_wait)


def memory_in_use() -> dict:
    """Process resident memory and, on CUDA, memory held by tensors (MiB)."""
    out = {"process_rss_mib": _rss_mib()}
    try:
        import torch

        if torch.cuda.is_available():
            out["cuda_allocated_mib"] = torch.cuda.memory_allocated() / 2**20
            out["cuda_reserved_mib"] = torch.cuda.memory_reserved() / 2**20
    except Exception:  # noqa: BLE001 - memory figures are advisory
        pass
    return out


def _rss_mib() -> float:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@st.cache_resource(show_spinner=False)
def warmed_up(name: str, device: str | None, dtype: str | None) -> bool:
    """One tiny full and POP prompt per model, so the first measured TTFT holds no one-time costs."""
    import torch

    from pop_analysis.engine.pop import run_prompt
    from pop_vllm.run_setting import RunSetting

    lm = shared_model(name, device, dtype)
    ids = torch.arange(1, 9, device=lm.device).unsqueeze(0)  # (1, 8)
    run_prompt(lm.adapter, ids, RunSetting.full())
    run_prompt(lm.adapter, ids, RunSetting((lm.adapter.n_layers - 1,)))
    return True
