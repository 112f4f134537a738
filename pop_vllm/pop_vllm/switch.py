"""The run-time full/POP switch (`pop_set`) in the engine core: settings are pinned per request.

A switch applies to the requests that arrive after it. The requests already in flight finish
first, under the settings they arrived with: the engine drains them. Why drain rather than serve
old and new requests side by side: the workers run one setting per step (one skip set, one
variant, one set of repair maps for the whole flattened batch), so two settings at once would
need a per-request layer loop; and a request switched mid-way would mix settings (a chunked
prompt's first chunks pruned under one, the rest under another, or a preempted request
recomputed under the new one) while its blocks keep the hash of its arrival settings.

How: the engine core (EngineCore.collective_rpc, through which LLM.collective_rpc and the guarded
control route reach the workers) checks the new settings at once (a bad one: one line, nothing
changes), then pins every request arriving from now on to them (prefix.use) and holds those
requests back in the waiting queue, while the ones that arrived before keep running. When none
of those is left (checked after every step, and when the engine goes idle) the workers switch
and the held requests are scheduled. The caller's collective_rpc returns then (vLLM completes a
utility call that returns a Future when it resolves). If the workers refuse the settings after
all, the held requests are pinned back to the settings in force and the caller gets the error.

An in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) is stepped by its caller, which is
waiting on the switch, so it cannot drain: there a switch with requests in flight is refused in
one line. With nothing in flight every engine switches at once.
"""
from __future__ import annotations

import inspect
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from . import prefix
from . import settings as pop_settings
from .engine_env import SWITCH
from .run_setting import RunSetting


@dataclass
class _Pending:
    epoch: int  # the requests pinned to the new settings
    call: Callable  # the workers' pop_set
    before: tuple | None  # the key in force before (restored if the workers refuse)
    future: Future = field(default_factory=Future)


_state: dict = {"epoch": 0, "running": 0, "pending": None}  # arrivals' epoch, the workers'


def reset() -> None:
    """A new engine core in this process: no switch pending."""
    _state.update(epoch=0, running=0, pending=None)


def admit(request) -> None:
    """A request arriving now runs under the settings of the latest switch."""
    request._pop_epoch = _state["epoch"]


def in_flight(scheduler, before: int | None = None) -> int:
    """Unfinished requests (of an epoch before `before`, when given)."""
    return sum(1 for r in scheduler.requests.values() if not r.is_finished()
               and (before is None or getattr(r, "_pop_epoch", 0) < before))


def switch(core, call: Callable, args, kwargs):
    """pop_set from the engine core: at once when nothing is in flight, else after the drain."""
    if not prefix.engine()["pop"]:
        return call()  # a stock model: the workers refuse it in one line
    new = prefix.key_of(_checked(args, kwargs))
    if _state["pending"] is not None:
        raise pop_settings.PopSettingsError(
            "a run-time switch is already waiting for the requests in flight to finish; send "
            "the next one when it has returned")
    busy = in_flight(core.scheduler)
    if not busy:
        out = call()
        prefix.use_key(new)
        return out
    if not _drains(core):
        raise pop_settings.PopSettingsError(
            f"{busy} request(s) in flight: an in-process engine is stepped by its caller, so it "
            "cannot finish them before switching; switch before adding requests or after they "
            "finish")
    _state["epoch"] += 1
    pending = _Pending(_state["epoch"], call, prefix.current())
    _state["pending"] = pending
    prefix.use_key(new)
    core._idle_state_callbacks.append(maybe_apply)
    return pending.future


def maybe_apply(core) -> None:
    """Switch the workers once no request of the old settings is left (idempotent)."""
    pending = _state["pending"]
    if pending is None or in_flight(core.scheduler, pending.epoch):
        return
    _state["pending"] = None
    try:
        out = pending.call()
    except Exception as e:  # noqa: BLE001 - refused after all: the held requests go back
        _state["epoch"] = _state["running"]
        prefix.use_key(pending.before)
        for r in core.scheduler.requests.values():
            if getattr(r, "_pop_epoch", 0) == pending.epoch:
                r._pop_epoch = _state["running"]
                prefix.repin(r, prefix.arrival_key(r))
        pending.future.set_exception(e)
        return
    _state["running"] = pending.epoch
    pending.future.set_result(out)


def held(waiting) -> list:
    """Waiting requests pinned to settings the workers do not run yet (only while draining)."""
    if _state["pending"] is None:
        return []
    return [r for r in waiting if getattr(r, "_pop_epoch", 0) != _state["running"]]


def _checked(args, kwargs) -> RunSetting:
    """The switch's settings, checked in the engine core as the workers will check them."""
    from .control import pop_set
    from .repair import check_settings

    try:
        bound = inspect.signature(pop_set).bind(None, *args, **(kwargs or {}))
    except TypeError as e:
        raise pop_settings.PopSettingsError(
            f"pop_set takes one run setting (RunSetting.as_config's fields): {e}") from None
    model = prefix.engine()
    pop = pop_settings.engine_setting(bound.arguments["config"], model["layers"])
    check_settings(pop, model["hf"])
    return pop


def _drains(core) -> bool:
    from vllm.v1.engine.core import EngineCoreProc

    return isinstance(core, EngineCoreProc)


# The engine core's hooks (patches.py): each builds a replacement from vLLM's original.

def wrap_scheduler_init(init):
    def scheduler_init(self, vllm_config, *args, **kwargs):
        # The scheduler is built in the engine core after the plugins load (EngineCore.__init__
        # loads them itself, too late to wrap it): the engine's own settings start here.
        prefix.configure(vllm_config)
        reset()
        init(self, vllm_config, *args, **kwargs)

    return scheduler_init


def wrap_add_request(add):
    def add_request(self, request, *args, **kwargs):
        prefix.pin(request)  # in order with switches: what it is hashed and run under
        admit(request)
        return add(self, request, *args, **kwargs)

    return add_request


def wrap_collective_rpc(rpc):
    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        call = lambda: rpc(self, method, timeout, args, kwargs)  # noqa: E731
        return switch(self, call, args, kwargs) if method == SWITCH else call()

    return collective_rpc


def wrap_schedule(schedule):
    def schedule_held_back(self, *args, **kwargs):
        hold = held(self.waiting)
        if hold:
            self.waiting.remove_requests(hold)
        try:
            return schedule(self, *args, **kwargs)
        finally:
            if hold:
                self.waiting.prepend_requests(reversed(hold))

    return schedule_held_back


def wrap_engine_step(step):
    def process_engine_step(self):
        try:
            return step(self)
        finally:
            maybe_apply(self)

    return process_engine_step
