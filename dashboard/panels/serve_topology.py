"""The Serve page's disaggregated topology: a prefill pool, a decode pool and the proxy between
them (pop_analysis.serving.disagg), started on dashboard.jobs and stopped like the single engines,
with one generation through the proxy.

The topology lives in this session's state; each member runs under a watchdog that ends it when
this dashboard process disappears, and the serving module's atexit list stops it on a clean exit.
"""
from __future__ import annotations

import json
import time
import urllib.request

import streamlit as st

from dashboard.panels import serve_engines
from dashboard.session import jobs, state
from pop_analysis.errors import first_line
from pop_analysis.serving import disagg
from pop_analysis.serving.spec import spec_for
from pop_vllm.run_setting import RunSetting

TOPOLOGY = "lab.serve_topology"  # the running Disaggregated of this session (or absent)
TOPO_GENERATED = "lab.serve_topology_generated"
DECODE_LABELS = {"pop": "POP, the prefill's settings", "full": "stock vLLM (full model)"}


def current() -> disagg.Disaggregated | None:
    t = st.session_state.get(TOPOLOGY)
    return t if t is not None and t.alive() else None


def stop() -> None:
    t = st.session_state.pop(TOPOLOGY, None)
    st.session_state.pop(TOPO_GENERATED, None)
    if t is not None:
        t.stop()


def start(model: str, setting: RunSetting, decode: str, int8: bool = False) -> None:
    """Stop the single engines (memory: three engines at once), then start the topology; `int8`:
    the prefill pool serves the model's int8 copy of every layer it does not skip."""
    serve_engines.stop()
    stop()
    spec = spec_for(model, setting)  # a bad skip set fails here, not in the job
    topology = disagg.plan(spec, decode, prefill_int8=disagg.KEPT if int8 else ())

    def run(monitor):
        return disagg.Disaggregated(topology).start(progress=serve_engines.steps(monitor)), False

    jobs.start("serve_topology", "Starting prefill, decode and proxy", run,
               serve_engines.started(TOPOLOGY, "topology", "Prefill, decode and proxy"),
               context={"model": model, "variant": str(setting.variant), "decode": decode,
                        "prefill int8": int8})


def generate(t: disagg.Disaggregated, prompt: str, max_tokens: int) -> None:
    """One greedy completion through the proxy (prefill on one instance, decode on the other)."""
    body = {"model": t.topology.prefill.name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0}
    req = urllib.request.Request(f"{t.url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            text = json.load(r)["choices"][0]["text"]
        st.session_state[TOPO_GENERATED] = {"text": text, "s": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - shown where the user pressed the button
        why = dead_cause(t) or first_line(e)
        state.flash("error", f"Generation through the proxy failed: {why}")


def dead_cause(t: disagg.Disaggregated) -> str | None:
    """Which member died and why, in one line (None while all three run)."""
    try:
        t.check()
        return None if t.alive() else "a member has stopped"
    except Exception as e:  # noqa: BLE001 - its one-line cause
        return first_line(e)


def section(model: str, setting: RunSetting) -> None:
    """The topology's controls and state; its prefill serves `setting` (POP for an A/A choice)."""
    with st.container(border=True):
        st.subheader("Disaggregated: prefill pool, decode pool, proxy")
        st.caption("A POP prefill instance and a decode instance, each pinned to its own cores, "
                   "hand the prompt's K/V over through POP Lab's KV connector; vLLM's router "
                   "sends each request to prefill, then to decode. Starting it stops the engines "
                   "above (memory).")
        t = st.session_state.get(TOPOLOGY)
        if t is not None and not t.alive():
            st.error(f"The topology stopped: {dead_cause(t)}")
            stop()
            t = None
        c = st.columns([2, 1, 1], vertical_alignment="bottom")
        decode = c[0].radio("Decode pool serves", disagg.DECODE_SIDES, horizontal=True,
                            key=state.kept("serve.decode", "pop", disagg.DECODE_SIDES),
                            format_func=DECODE_LABELS.get)
        int8 = c[0].toggle("Prefill pool in int8 (its kept layers; decode stays fp32)",
                           key=state.kept("serve.prefill_int8", False),
                           help="the prefill instance serves an int8 copy of the model (POP Lab's "
                                "int8 weights, written once), the decode instance the fp32 "
                                "model (docs/serving.md, An int8 prefill pool)")
        label = "Start topology" if t is None else "Restart topology"
        if c[1].button(label, key="serve.topo_start", disabled=jobs.running("serve_topology")):
            try:
                start(model, setting if setting.active else setting.replace(variant="pop"),
                      decode, int8)
            except (disagg.ServingError, ValueError) as e:
                st.error(f"The topology did not start: {e}")
        c[2].button("Stop topology", key="serve.topo_stop", on_click=stop, disabled=t is None)
        jobs.panel("serve_topology")
        if t is not None:
            _show(t)


def _show(t: disagg.Disaggregated) -> None:
    info = t.info()
    st.markdown("  \n".join(info["topology"]) + f"  \nproxy at `{info['url']}`")
    with st.expander("The exact commands (prefill, decode, proxy)"):
        for name, m in info["members"].items():
            st.code(f"# {name}, ready in {m['start_s']:.1f} s, {m['rss_mib']} MiB\n{m['command']}",
                    language="bash")
    prompt = st.text_input("Prompt through the proxy", key=state.kept("serve.topo_prompt",
                                                                       "Why is the sky blue?"))
    if st.button("Generate through prefill and decode", key="serve.topo_generate"):
        with st.spinner("Prefill, hand-off, decode ..."):
            generate(t, prompt, 32)
        st.rerun()
    got = st.session_state.get(TOPO_GENERATED)
    if got:
        st.markdown(f"Answered in {got['s']:.2f} s (prefill, hand-off, 32 tokens of decode):")
        st.text(got["text"])
