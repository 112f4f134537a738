"""Serve: POP inside vLLM, a real serving engine, against stock vLLM under load."""
import math

import streamlit as st

from dashboard.charts import serve as serve_charts
from dashboard.panels import exports, serve_engines, serve_topology, widgets
from dashboard.session import jobs, state
from pop_analysis.engine.skipset import describe
from pop_analysis.serving import venv
from pop_analysis.serving.loadgen import LoadSpec
from pop_vllm.run_setting import RunSetting

st.title("Serve: POP in vLLM")
st.markdown("A local vLLM engine (OpenAI-compatible, on 127.0.0.1 only) serves the current model "
            "with POP's skip set through the POP plugin, switched between the full model and POP at "
            "run time, so both sides share one engine. Generate through both, then load them with "
            "vLLM's own benchmark (continuous batching, chunked prefill) and compare time to first "
            "token (TTFT), time per output token (TPOT) and throughput; all stop with the app.")

lm = widgets.model_or_stop()
model = state.model_spec().name
skip = state.skip_for(lm.adapter.n_layers)
st.caption(f"Model {model} · skip set: layers {describe(skip)} ({len(skip)}/{lm.adapter.n_layers}) "
           "— change it on the Skip set page or in the sidebar.")
state.show_flash()

if not venv.ready():
    with st.container(border=True):
        try:
            venv.python()
        except venv.ServingError as e:
            st.warning(f"The serving engine is not ready: {e}")
        label = ("Update the POP plugin (seconds)" if venv.plugin_stale()
                 else f"Install the serving engine ({venv.DOWNLOAD})")
        st.button(label, type="primary",
                  key="serve.install", on_click=serve_engines.start_install,
                  disabled=jobs.running("serve_install"))
        jobs.panel("serve_install")
    st.stop()

died = serve_engines.dead_note()
if died:
    st.error(died)
s = serve_engines.current()
with st.container(border=True):
    st.subheader("Engines")
    c = st.columns([2, 1, 1], vertical_alignment="bottom")
    options = serve_engines.variants(lm, skip)  # pop_repair where a stored repair fits the skip set
    variant = c[0].radio("POP engine serves", options, horizontal=True,
                         key=state.kept("serve.variant", "pop", options),
                         format_func=serve_engines.VARIANT_LABELS.get)
    compiled = c[0].toggle("Compiled (faster prefill, slower start)",
                           key=state.kept("serve.compiled", False),
                           help="vLLM compiles the model, the POP plugin its skipped block's "
                                "pieces: about 100 s to start on 2 cores, eager about 20 s")
    starting = jobs.running("serve_start")
    if c[1].button("Start" if s is None else "Restart", type="primary", key="serve.start",
                   disabled=starting):
        try:
            serve_engines.start_engines(model, RunSetting(skip, variant), lm, eager=not compiled)
        except (venv.ServingError, ValueError) as e:  # a model it cannot serve; RepairError too
            st.error(f"The engine did not start: {e}")
    c[2].button("Stop", key="serve.stop", on_click=serve_engines.stop, disabled=s is None)
    jobs.panel("serve_start")
    s = serve_engines.current()
    if s is not None:
        for name, info in s.engines_info().items():
            st.markdown(f"**{name}** engine ({info['serves']}, "
                        f"{'eager' if s.spec.eager else 'compiled'}) at `{info['url']}` · ready in "
                        f"{info['start_s']:.1f} s · "
                        f"{info['rss_mib']} MiB resident")
        with st.expander("The exact vLLM commands"):
            for name, info in s.engines_info().items():
                st.code(info["command"], language="bash")
        stale = serve_engines.stale_note(s, RunSetting(skip, variant), compiled)
        if stale:
            st.warning(stale)

serve_topology.section(model, RunSetting(skip, variant))
if s is None:
    st.info("Start the engines to generate through them and load test them.")
    st.stop()

with st.container(border=True):
    st.subheader("Generate side by side")
    prompt = st.text_area("Prompt", key=state.kept("serve.prompt", "Why is the sky blue?"), height=90)
    c = st.columns([1, 1], vertical_alignment="bottom")
    max_tokens = widgets.number(c[0], "Max new tokens", 1, 512, key=state.kept("serve.max_tokens", 48))
    if c[1].button("Generate", type="primary", key="serve.generate", disabled=widgets.refused()):
        with st.spinner("Generating through both engines ..."):
            serve_engines.generate(s, prompt, int(max_tokens))
        st.rerun()
    got = st.session_state.get(serve_engines.GENERATED)
    if got:
        cols = st.columns(len(s.names))
        for col, name in zip(cols, s.names):
            g = got.get(name)
            if g:
                col.markdown(f"**{name}** · TTFT {g['ttft_ms']:.0f} ms · "
                             f"{g['decode_tokens_per_s'] or 0:.1f} tok/s decode")
                col.text(g["text"])
        st.caption("Greedy, one request each, streamed; single TTFTs are for reading. "
                   "The load test below times them.")

with st.container(border=True):
    st.subheader("Load test: full against POP, alternated")
    c = st.columns([1, 1, 1, 1, 2], vertical_alignment="bottom")
    n_req = widgets.number(c[0], "Requests", 1, 256, key=state.kept("serve.requests", 16))
    n_in = widgets.number(c[1], "Prompt tokens", 16, 3800, key=state.kept("serve.input_len", 512))
    n_out = widgets.number(c[2], "Output tokens", 2, 256, key=state.kept("serve.output_len", 32))
    rounds = widgets.number(c[3], "Rounds", 3, 10, key=state.kept("serve.rounds", 3))
    rates = c[4].multiselect("Request rates (req/s)", [0.5, 1.0, 2.0, 4.0, 8.0, math.inf],
                             key=state.kept("serve.rates", [2.0, math.inf]),
                             format_func=lambda r: "all at once" if math.isinf(r) else f"{r:g}")
    cap = widgets.number(st, "At most this many requests in flight (0: no cap)", 0, 256,
                         key=state.kept("serve.concurrency", 0))
    now = {"requests": int(n_req), "prompt tokens": int(n_in), "output tokens": int(n_out),
           "rates": sorted(rates), "rounds": int(rounds), "cap": int(cap),
           "skip set": describe(s.spec.setting.skip), "variant": str(s.spec.setting.variant)}
    if st.button("Run the load test", type="primary", key="serve.bench",
                 disabled=not rates or jobs.running("serve_bench") or widgets.refused()):
        try:
            specs = [LoadSpec(int(n_req), int(n_in), int(n_out), r, int(cap) or None).check(
                s.spec.max_model_len) for r in sorted(rates)]
            serve_engines.start_bench(s, specs, int(rounds), now)
        except venv.ServingError as e:
            st.error(f"Load test: {e}")
    jobs.panel("serve_bench")

rows = st.session_state.get(serve_engines.BENCH)
if rows:
    widgets.made_from(serve_engines.BENCH, now, "Run the load test")
    widgets.table(serve_engines.table(rows), hide_index=True, key="serve.table")
    figures = {"speedup": serve_charts.speedup_chart(rows),
               "ttft_cdf": serve_charts.latency_cdf(rows),
               "tpot": serve_charts.tpot_box(rows),
               "throughput": serve_charts.throughput_bars(rows)}
    st.plotly_chart(figures["speedup"], key="serve.speedup")
    a, b = st.columns(2)
    a.plotly_chart(figures["ttft_cdf"], key="serve.ttft")
    b.plotly_chart(figures["tpot"], key="serve.tpot")
    st.plotly_chart(figures["throughput"], key="serve.throughput")
    st.caption("Each round runs the whole load on each engine, the order swapped every round; "
               "ratios are medians of the per-round ratios with their IQR, flagged as the timing "
               "protocol flags any speed figure. The engine shares this machine's cores with the "
               "load generator (and with whatever else runs here).")
    exports.offer("serve", data=rows, rows=serve_engines.table(rows), figures=figures)
