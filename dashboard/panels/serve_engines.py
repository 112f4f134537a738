"""Plumbing of the Serve page: the session's vLLM engines (pop_analysis.serving.Serving), the
install, start and load-test runs on dashboard.jobs, generation through the engines.

The engines live in this session's state and in the serving module's atexit list, and each runs
under a watchdog that ends it when this dashboard process disappears: none outlives the process.
"""
from __future__ import annotations

import streamlit as st

from dashboard.panels import kv_repair
from dashboard.session import jobs, state
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.progress import Tracker, duration
from pop_analysis.serving import venv
from pop_analysis.serving.session import Serving
from pop_analysis.serving.spec import spec_for
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import Variant

SERVING = "lab.serving"  # the running Serving of this session (or absent)
BENCH = "lab.serve_bench"  # rows of the last load test
GENERATED = "lab.serve_generated"  # {"full": {...}, variant: {...}, "prompt": ...}
INSTALL_STEPS = 5  # lines the install script prints on a fresh build


def current() -> Serving | None:
    s = st.session_state.get(SERVING)
    return s if s is not None and s.alive() else None


def dead_note() -> str | None:
    """One line when this session's engines died (and forget them)."""
    s = st.session_state.get(SERVING)
    if s is None or s.alive():
        return None
    st.session_state.pop(SERVING, None)
    try:
        s.check()
        return "The engine has stopped."
    except Exception as e:  # noqa: BLE001 - its one-line cause
        s.stop()
        return f"The engine stopped: {first_line(e)}"


def steps(monitor):
    """progress(done, total, message) -> a Tracker on the job's monitor (made at the first call)."""
    box = {}

    def show(done, total, message):
        t = box.setdefault("t", Tracker(total, monitor))
        t.step(max(done - t.done, 0), message)
    return show


def start_install() -> None:
    def run(monitor):
        t = Tracker(INSTALL_STEPS, monitor, "building .venv-vllm")
        lines = []

        def on_line(line):
            lines.append(line)
            t.step(1 if line.startswith("install_vllm:") and t.done < t.total - 1 else 0, line[:120])
        code = venv.install(on_line, cancel=monitor.cancel_event)
        if code:
            raise RuntimeError(f"the install script failed (exit {code}): {lines[-1] if lines else ''}")
        return None, False

    def done(job):
        if job.error is not None:
            return "error", f"Installing the serving engine failed: {first_line(job.error)}"
        if job.cancelled is not None:
            return "warning", "Installing the serving engine was cancelled."
        return "success", f"The serving engine is installed ({duration(job.seconds)})."
    jobs.start("serve_install", f"Installing vLLM ({venv.DOWNLOAD})", run, done)


VARIANT_LABELS = {Variant.POP: "POP, switched to full and back at run time",
                  Variant.POP_REPAIR: "POP with the newest stored K/V repair, switched to full and back",
                  Variant.FULL: "full only (A/A noise check)"}


def variants(lm: LoadedModel, skip) -> tuple[str, ...]:
    """What the POP engine can serve: pop_repair only where a stored repair fits the skip set."""
    return ("pop", "pop_repair", "full") if kv_repair.stored_key(lm, skip) else ("pop", "full")


def start_engines(model: str, setting: RunSetting, lm: LoadedModel | None = None,
                  eager: bool = True) -> None:
    """Start the engines; pop_repair serves the newest stored repair that fits `lm` and the
    skip set (its maps file from the repair store); eager=False lets vLLM compile (the plugin
    compiles POP's block too: docs/serving.md)."""
    stop()
    repairing = setting.variant == Variant.POP_REPAIR
    spec_for(model, setting.replace(variant=Variant.POP) if repairing else setting)  # fails here

    def run(monitor):
        served = setting
        if repairing:
            from pop_analysis.repair.store import maps_file

            key = kv_repair.stored_key(lm, setting.skip)
            if key is None:
                raise ValueError("no stored repair fits this skip set (fit one on the Skip set page)")
            served = setting.replace(repair=maps_file(key))
        return Serving(spec_for(model, served, eager=eager), progress=steps(monitor)), False

    jobs.start("serve_start", "Starting vLLM", run, started(SERVING, "engine", "Engines"),
               context={"model": model, "variant": str(setting.variant), "eager": eager})


def stale_note(s: Serving, setting: RunSetting, compiled: bool) -> str | None:
    """Why the running engines no longer match the page's setting and mode (None: they do)."""
    served = s.spec.setting
    if (served.variant == setting.variant and s.spec.eager != compiled
            and (not s.spec.pop or served.skip == setting.skip)):
        return None
    return ("Stale: the engines serve another skip set, variant or mode "
            f"({describe(served.skip)}, {served.variant}, "
            f"{'eager' if s.spec.eager else 'compiled'}); press **Restart**.")


def started(key: str, what: str, ready: str):
    """A start job's outcome: its result kept under `key` or why not in one line."""
    def done(job):
        if job.error is not None:
            return "error", f"The {what} did not start: {first_line(job.error)}"
        if job.cancelled is not None:
            return "warning", f"Starting the {what} was cancelled; nothing is left running."
        st.session_state[key] = job.result[0]
        return "success", f"{ready} ready in {duration(job.seconds)}."
    return done


def stop() -> None:
    s = st.session_state.pop(SERVING, None)
    if s is not None:
        s.stop()
        # the start's note ("Engines ready in ...") must not outlive the engines
        st.session_state[jobs.NOTE + "serve_start"] = ("info", "Engines stopped.", ())


def generate(s: Serving, prompt: str, max_tokens: int) -> None:
    try:
        out = {name: s.generate(name, prompt, max_tokens) for name in s.names}
        st.session_state[GENERATED] = {"prompt": prompt, **out}
    except Exception as e:  # noqa: BLE001 - shown where the user pressed the button
        state.flash("error", f"Generation failed: {first_line(e)}")


def start_bench(s: Serving, specs, rounds: int, context: dict) -> None:
    def run(monitor):
        return s.bench(specs, rounds=rounds, progress=monitor), False

    jobs.start("serve_bench", "Load test", run, lambda job: jobs.outcome(
        job, BENCH, "Load test", "use fewer requests or a smaller KV cache.",
        lambda rows: f"{len(rows)} of {len(specs)} rates",
        lambda rows: f"{len(rows)} rates measured in {duration(job.seconds)}"), context=context)


def table(rows: list[dict]) -> list[dict]:
    """One line per request rate with the protocol's fields, for st.dataframe; the flag stands
    beside the speedup it qualifies (a flagged ratio is never read alone)."""
    ms = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return [{"rate": "all at once" if r["request_rate"] is None else f"{r['request_rate']:g}/s",
             "TTFT speedup": round(r["speedup"], 2),
             "IQR": f"{r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f}",
             "rounds": r["timing_rounds"], "flag": r["timing_note"] or "trustworthy",
             "TTFT full ms": ms(r["ttft_full_ms"]), "TTFT POP ms": ms(r["ttft_pop_ms"]),
             "p90 full": ms(r["ttft_p90_full_ms"]), "p90 POP": ms(r["ttft_p90_pop_ms"]),
             "TPOT full ms": ms(r["tpot_full_ms"]), "TPOT POP ms": ms(r["tpot_pop_ms"]),
             "tok/s full": ms(r["throughput_full"]), "tok/s POP": ms(r["throughput_pop"])}
            for r in rows]
