"""Sweeps: speed vs quality over skip ratios, the ablations and input lengths, beside the paper."""
import datetime

import streamlit as st

from dashboard.charts import sweeps as sweep_charts
from dashboard.charts.overlays import overlay_sweeps
from dashboard.panels import exports, generate_speed, kv_repair, model_compare, presenter, widgets
from dashboard.session import cached, classmode, jobs, state
from pop_analysis.data.allowed_paths import check_source
from pop_analysis.errors import first_line
from pop_analysis.experiments import sweep as sw
from pop_analysis.progress import duration
from pop_analysis.quality.summary import comparison_rows

st.title("Sweeps: speed vs quality")
st.markdown("Results of the evaluation sweeps (the CLI fills the same store), each next to the "
            "paper's numbers. Every speedup comes from the timing protocol: full model and "
            "variant alternated with the order swapped each round, the median of the per-round "
            "ratios with their interquartile range as error bars. Points ringed in red were "
            "flagged (noisy rounds, a busy machine, or above what is possible): hover for why, "
            "and re-run the sweep when the machine is quieter.")

KINDS = {"ratio": "speed vs quality over skip ratios", "ablation": "the paper's ablations",
         "length": "prefill speedup vs input length", "adaptive": "adaptive skip sets from scores"}
PAPER_FOR = {"ratio": "table4", "adaptive": "table4", "ablation": "table3", "length": "table2"}
lm = widgets.model_or_stop()
calib = st.session_state.get(state.CALIBRATION)

with st.expander("Run a sweep", expanded=jobs.running("sweep")):
    c = st.columns(5)
    kind = c[0].selectbox("Sweep", list(KINDS), format_func=KINDS.get, key=state.kept("sw.kind", "ratio"))
    n_samples = widgets.number(c[1], "Samples", 1, 1319, key=state.kept("sw.n", sw.DEFAULT_SAMPLES),
                                  help="items per variant; the default gives POP's NLL difference "
                                       "on GSM8K a 95% interval narrower than 0.05 nats")
    max_new = widgets.number(c[2], "New tokens", 1, 256, key=state.kept("sw.len", 16))
    repeats = widgets.number(c[3], "Timing rounds (at least)", 3, 50, key=state.kept("sw.rep", 3))
    dataset = c[4].text_input("Data set", key=state.kept("sw.data", "gsm8k"),
                              help="gsm8k, wizardlm, builtin, a path")
    with_repair = kv_repair.sweep_option(lm, kind)  # {} unless pop_repair rows are asked for
    now = {"sweep": kind, "data set": dataset, "samples": int(n_samples),
           "new tokens": int(max_new), "timing rounds": int(repeats), **with_repair}
    if st.button("Run sweep", type="primary", key="sw.go", disabled=jobs.running("sweep") or widgets.refused()):
        cfg = sw.SweepConfig(dataset=dataset, n_samples=int(n_samples), max_new_tokens=int(max_new),
                             repeats=int(repeats), **with_repair)
        try:
            check_source(dataset)  # a path typed here must lie in an allowed folder
            if kind == "adaptive" and calib is None:
                raise ValueError("the adaptive sweep needs a calibration: run one on the Calibrate page")
        except ValueError as e:
            st.error(f"Sweep failed: {first_line(e)}")
        else:
            jobs.start("sweep", f"Sweep ({kind})", lambda p: sw.cached_sweep(
                lm, kind, cfg, progress=p, calibration=calib, notice=p.notice),
                lambda job: jobs.outcome(
                    job, state.SWEEP, f"Sweep ({kind})", "use fewer samples or shorter lengths.",
                    lambda part: f"{len(part.rows)} rows",
                    lambda r: f"finished in {duration(r.seconds)}"), context=now)
    jobs.panel("sweep")

entries = cached.stored_entries("sweep")
if entries:
    by_key = {e["key"]: e for e in entries}

    def label_of(key):
        p = by_key[key]["params"]
        when = datetime.datetime.fromtimestamp(by_key[key]["saved_at"]).strftime("%Y-%m-%d %H:%M")
        return f"{p.get('kind', '?')} · {p.get('model', '?')} · {p.get('device', '')} · {when}"
    c = st.columns([4, 1], vertical_alignment="bottom")
    key = c[0].selectbox("Stored sweeps", list(by_key), format_func=label_of, key="sw.stored")
    if c[1].button("Load", key="sw.load"):
        res = cached.load_result("sweep", key, sw.SweepResult)
        if res is not None:
            state.keep_result(state.SWEEP, res, {"stored": label_of(key)})
    st.multiselect("Overlay stored sweeps of the same kind on the chart", list(by_key),
                   format_func=label_of, key=state.kept("sw.overlay", [], list(by_key)),
                   max_selections=6)
    st.button("Same chart for both embedded models", key="sw.models", args=(entries,),
              on_click=model_compare.overlay_other_models, disabled=state.SWEEP not in st.session_state,
              help="overlay the newest stored sweep of this kind of the other embedded model")
    state.show_flash()

res = st.session_state.get(state.SWEEP)
if res is None:
    st.info("No sweep shown yet: run one above or load a stored one.")
else:
    st.subheader(f"{KINDS.get(res.kind, res.kind)} — {res.model}")
    st.caption(f"{res.data} · {res.device} · {res.threads} threads · {res.seconds:.0f} s")
    widgets.made_from(state.SWEEP, now, "Run sweep")
    classmode.offer_back("sweep", lm.name, lm.adapter.n_layers)
    for note in res.notes or []:  # fewer items than asked for, or too few for intervals
        st.info(note)
    rows = res.rows
    t4, t2 = sw.PAPER_TABLES["table4"], sw.PAPER_TABLES["table2"]
    overlays = cached.sweep_overlays(state.value("sw.overlay", []), res.kind,
                                   {k: label_of(k) for k in by_key} if entries else {})
    fig = None
    if res.kind in ("ratio", "adaptive") and rows:
        metrics = [m for m in ("continuation_nll", "next_token_kl", "next_token_top1",
                               "greedy_agreement", "exact_match", "sequence_exact", "retrieval_acc")
                   if any(r.get(m) is not None for r in rows)]
        quality = st.radio("Quality metric", metrics, horizontal=True, key="sw.metric")
        paper = {"ratio": t4["ratios"], "speedup": t4["prefill_speedup"]}
        if quality == "exact_match":  # the paper's GSM8K accuracy, as a fraction
            paper.update(quality=[v / 100 for v in t4["GSM8K"]], quality_name="GSM8K")
        fig = overlay_sweeps(sweep_charts.ratio_chart(rows, quality, paper), overlays, "skip_ratio",
                             quality)
        presenter.plot(fig, key="sw.ratio")
    elif res.kind == "length" and rows:
        paper = {m: {"length": t2["lengths"], "speedup": v} for m, v in t2["rows"].items()}
        fig = overlay_sweeps(sweep_charts.length_chart(rows, paper), overlays, "length")
        presenter.plot(fig, key="sw.length")
    elif res.kind == "ablation" and rows:
        metrics = [m for m in ("continuation_nll", "next_token_kl", "retrieval_acc", "exact_match")
                   if any(r.get(m) is not None for r in rows)]
        quality = st.radio("Quality metric", metrics, horizontal=True, key="sw.metric")
        fig = sweep_charts.quality_chart(rows, quality)
        presenter.plot(fig, key="sw.quality")
    if overlays and res.kind != "ablation":
        st.caption(f"Overlaid: {len(overlays)} stored sweep(s) as dashed (speedup) and dotted "
                   "(quality) lines.")
    elif state.value("sw.overlay"):
        st.caption("Overlays are drawn on the ratio, adaptive and length charts.")
    compare = comparison_rows(rows)
    if compare and len(compare[0]) > 2:  # some metric has a paired difference from the full model
        st.markdown("**Quality against the full model** (variant − full, paired over the same "
                    "items, 95% interval; an interval that includes 0 is *no measurable change*)")
        widgets.table(compare, hide_index=True, key="sw.compare")
    frame = res.to_frame()
    if res.kind == "ablation" and "variant" in frame:
        paper = sw.paper_frame("table3").add_prefix("paper ")
        frame = frame.join(paper, on="variant")
    widgets.table(generate_speed.sweep_table(frame, res.kind), hide_index=True, key="sw.table")
    st.caption("The speedup is the median of per-round ratios (full and variant timed back to "
               "back); ttft columns are each side's median: noisy rounds (flagged) can part them.")
    exports.offer("sweep", data=res.to_dict(), rows=rows, figures={"chart": fig} if fig else None)

st.subheader("The paper's numbers")
for name in ("table4", "table3", "table2", "table1"):
    table = sw.PAPER_TABLES[name]
    with st.expander(f"{name}: {table['title']}", expanded=res is not None and PAPER_FOR.get(res.kind) == name):
        widgets.table(sw.paper_frame(name), key=f"sw.paper.{name}")
        for note in ("note", "static"):
            if note in table:
                st.caption(table[note])
