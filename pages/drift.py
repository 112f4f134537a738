"""Drift: how far POP's hidden states, K/V cache and attention outputs move from the full model."""
import streamlit as st

from dashboard.charts import drift as drift_charts
from dashboard.panels import drift_heal, drift_runs, exports, kv_repair, presenter, widgets
from dashboard.session import classmode, jobs, state
from pop_analysis.data.example_prompts import EXAMPLES, SHORT
from pop_analysis.engine.generate import encode
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.inspection import drift as dr
from pop_analysis.inspection import drift_length
from pop_analysis.progress import duration
from pop_vllm.run_setting import RunSetting

st.title("Representation drift: POP vs full")
st.markdown("Cosine similarity between POP and the full model per layer: hidden states and K/V cache "
            "entries of prompt tokens, and attention outputs of decode steps. The paper (Qwen3-VL, "
            "last 12 layers) sees hidden states fall to ≈0.71 and V entries to ≈0.46 while the "
            "attention output stays above 0.96: attention absorbs the KV drift. Those values are "
            "drawn as dashed red lines.")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
skip = state.skip_for(n)
st.caption(f"Skip set: layers {describe(skip)} ({len(skip)}/{n}) — change it on the Skip set page "
           "or in the sidebar.")


def use_example() -> None:
    st.session_state["drift.prompt"] = EXAMPLES[st.session_state["drift.example"]]


def outcome(key: str, what: str):
    """on_done of a drift run (one DriftResult) or a drift-vs-length run (rows per length)."""
    return lambda job: jobs.outcome(
        job, key, what, "use a shorter prompt or fewer steps.",
        lambda rows: f"lengths {[r['length'] for r in rows]}",
        lambda r: f"{len(r)} lengths measured" if isinstance(r, list) else
        f"measured in {duration(r.seconds)}")


with st.container(border=True):
    st.selectbox("Example", list(EXAMPLES), key="drift.example", on_change=use_example, index=None,
                 placeholder="pick an example (a long one shows more drift) ...")
    prompt = st.text_area("Prompt", key=state.kept("drift.prompt", state.value("gen.prompt", SHORT)),
                          height=110, help="starts as the Generate page's prompt")
    variants = ["pop"] + (["pop_repair"] if kv_repair.stored_key(lm, skip) else [])
    variant = st.radio("Compare the full model with", variants, horizontal=True,
                       key=state.kept("drift.variant", "pop", variants),
                       format_func={"pop": "POP", "pop_repair": kv_repair.SHORT}.get,
                       help="pop_repair appears once a K/V repair is stored for this skip set "
                            "(Skip set page)")
    c = st.columns(3, vertical_alignment="bottom")
    steps = widgets.number(c[0], "Decode steps compared", 1, 64, key=state.kept("drift.steps", 8))
    raw = widgets.raw_box(c[1], lm, "drift.raw")
    go = c[2].button("Measure drift", type="primary", key="drift.go",
                     disabled=jobs.running("drift") or not prompt.strip() or widgets.refused())
    cfg = dr.DriftConfig(decode_steps=int(steps))
    now = {"prompt": prompt, "variant": variant, "skip set": describe(skip),
           "decode steps": int(steps), "raw": raw}

    def measure(p):
        if variant == "pop_repair":
            kv_repair.use_stored(lm, skip)  # under the model lock: the newest stored maps
        return dr.cached_drift(lm, ids, RunSetting(skip, variant), cfg, progress=p,
                               notice=p.notice)

    if go:
        try:
            ids = encode(lm, prompt or "", raw=raw)
            jobs.start("drift", "Measuring drift", measure, outcome(state.DRIFT, "Drift"),
                       context=now)
        except ValueError as e:
            st.error(f"Drift failed: {first_line(e)}")
    jobs.panel("drift")


res = st.session_state.get(state.DRIFT)
figures: dict = {}
if res is not None:
    d = res.to_dict()
    st.subheader(f"{res.model} · {res.prompt_tokens} prompt tokens · skipped {describe(res.skip_layers)}")
    widgets.made_from(state.DRIFT, now, "Measure drift")
    classmode.offer_back("drift", lm.name, n)
    only = st.toggle("Only the skipped block (paper style)", key=state.kept("drift.only", True))
    figures["curves"] = drift_runs.curves_of(res, only)
    presenter.plot(figures["curves"], key="drift.curves")
    drift_runs.departures(res)
    qty = st.radio("Heatmap of", ("hidden", "k", "v", "attn_out"), horizontal=True,
                   key=state.kept("drift.qty", "hidden"), format_func=drift_charts.COSINE_NAMES.get)
    decode = qty == "attn_out"
    figures["heatmap"] = drift_charts.drift_heatmap(
        d[f"{qty}_tok"], None if decode else res.tokens,
        f"Per-token cosine: {drift_charts.COSINE_NAMES[qty]} (layer x {'decode step' if decode else 'token'})",
        x_title="decode step (0 = the boundary token x_N)" if decode else "prompt token (downsampled)")
    presenter.plot(figures["heatmap"], key="drift.heat")
    figures["decode_steps"] = drift_charts.decode_steps_chart(res.kl, res.top1_agree)
    presenter.plot(figures["decode_steps"], key="drift.steps_chart")

    def pin() -> None:
        state.keep_result(state.DRIFT_B, res, state.context_of(state.DRIFT))

    st.button("Pin this run as B, to compare with the next one", key="drift.pin", on_click=pin)

drift_runs.stored_runs()
res_b = st.session_state.get(state.DRIFT_B)
if res is not None and res_b is not None:
    drift_runs.side_by_side(res, res_b, figures)

drift_heal.section(lm, skip, prompt, raw, figures)

st.subheader("Drift vs context length")
c = st.columns([3, 1], vertical_alignment="bottom")
lengths = c[0].multiselect("Prompt lengths (tokens)", [16, 32, 64, 128, 256, 512, 1024, 2048],
                           key=state.kept("drift.lengths", [32, 128]))
len_now = {"lengths": sorted(lengths), "skip set": describe(skip), "decode steps": int(steps)}
if c[1].button("Measure vs length", key="drift.len_go",
               disabled=not lengths or jobs.running("drift_length")):
    jobs.start("drift_length", "Drift vs length", lambda p: drift_length.cached_drift_by_length(
        lm, sorted(lengths), RunSetting(skip), cfg, progress=p, notice=p.notice),
        outcome(state.DRIFT_LENGTH, "Drift vs length"),
        context=len_now)
jobs.panel("drift_length")
rows = st.session_state.get(state.DRIFT_LENGTH)
if rows:
    widgets.made_from(state.DRIFT_LENGTH, len_now, "Measure vs length")
    figures["vs_length"] = drift_charts.drift_length_chart(rows)
    presenter.plot(figures["vs_length"], key="drift.length_chart")
    st.caption("Prompts are cut from the built-in texts; block means over the skipped layers.")

if res is not None or rows:
    exports.offer("drift", data={"run": res.to_dict() if res else None,
                                 "pinned_b": res_b.to_dict() if res_b else None,
                                 "by_length": rows},
                  rows=rows or ([{"layer": i, **{q: res.to_dict()[f"{q}_cos"][i]
                                                 for q in drift_charts.COSINES}}
                                 for i in range(res.n_layers)] if res else None),
                  figures=figures)
