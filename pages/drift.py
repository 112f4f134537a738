"""Drift: how far POP's hidden states, K/V cache and attention outputs move from the full model."""
import streamlit as st
import torch

from dashboard import charts, repair_panel, state, widgets
from dashboard.examples import EXAMPLES
from pop_analysis import drift as dr
from pop_analysis.generate import encode
from pop_analysis.skipset import describe

st.title("Representation drift: POP vs full")
st.markdown("Cosine similarity between POP and the full model per layer: hidden states and K/V cache "
            "entries of prompt tokens, and attention outputs of decode steps. The paper (Qwen3-VL, "
            "last 12 layers) sees hidden states fall to ≈0.71 and V entries to ≈0.46 while the "
            "attention output stays above 0.96: attention absorbs the KV drift.")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
skip = state.skip_for(n)
st.caption(f"Skip set: layers {describe(skip)} ({len(skip)}/{n}) — change it on the Skip set page.")


def use_example() -> None:
    st.session_state["drift.prompt"] = EXAMPLES[st.session_state["drift.example"]]


with st.container(border=True):
    st.selectbox("Example", list(EXAMPLES), key="drift.example", on_change=use_example, index=None,
                 placeholder="pick an example (a long one shows more drift) ...")
    prompt = st.text_area("Prompt", key="drift.prompt", height=110)
    variants = ["pop"] + (["pop_repair"] if repair_panel.stored_key(lm, skip) else [])
    if st.session_state.get("drift.variant") not in variants:
        st.session_state.pop("drift.variant", None)
    variant = st.radio("Compare the full model with", variants, horizontal=True, key="drift.variant",
                       format_func={"pop": "POP", "pop_repair": repair_panel.SHORT}.get,
                       help="pop_repair appears once a K/V repair is stored for this skip set "
                            "(Skip set page)")
    c = st.columns(3)
    steps = c[0].number_input("Decode steps compared", 1, 64, 8, key="drift.steps")
    raw = c[1].checkbox("Raw (no chat template)", key="drift.raw")
    go = c[2].button("Measure drift", type="primary", key="drift.go")


def guarded(label: str, fn):
    """Run fn(progress) under the model lock with a progress bar; errors go where the user clicked.
    Returns (result, progress summary) or None."""
    try:
        with widgets.run_lock(), widgets.ProgressBar(label) as bar:
            return fn(bar), bar.summary
    except torch.OutOfMemoryError:
        st.error(f"{label}: out of memory; use a shorter prompt or fewer steps.")
    except (ValueError, RuntimeError, OSError) as e:
        st.error(f"{label} failed: {e}")
    return None


cfg = dr.DriftConfig(decode_steps=int(steps))


def measure(bar):
    ids = encode(lm, prompt or "", raw=raw)
    if variant == "pop_repair":
        repair_panel.use_stored(lm, skip)  # under the model lock: the newest stored maps
    return dr.cached_drift(lm, ids, skip, cfg, progress=bar, variant=variant, notice=st.warning)


if go:
    out = guarded("Drift", measure)
    if out is not None:
        (res, hit), summary = out
        st.session_state[state.DRIFT] = res
        st.success("Loaded from the cache." if hit else f"Computed; {summary}.")

res = st.session_state.get(state.DRIFT)
if res is not None:
    d = res.to_dict()
    st.subheader(f"{res.model} · {res.prompt_tokens} prompt tokens · skipped {describe(res.skip_layers)}")
    only = st.toggle("Only the skipped block (paper style)", True, key="drift.only")
    st.plotly_chart(charts.drift_curves(d, res.skip_layers, only), key="drift.curves")
    qty = st.radio("Heatmap of", ("hidden", "k", "v", "attn_out"), horizontal=True, key="drift.qty",
                   format_func=charts.COSINE_NAMES.get)
    st.plotly_chart(charts.drift_heatmap(d[f"{qty}_tok"], res.tokens if qty != "attn_out" else None,
                                         f"Per-token cosine: {charts.COSINE_NAMES[qty]} (layer x "
                                         f"{'decode step' if qty == 'attn_out' else 'token'})"),
                    key="drift.heat")
    st.plotly_chart(charts.decode_steps_chart(res.kl, res.top1_agree), key="drift.steps_chart")

st.subheader("Drift vs context length")
c = st.columns([3, 1])
lengths = c[0].multiselect("Prompt lengths (tokens)", [16, 32, 64, 128, 256, 512, 1024, 2048],
                           [32, 128], key="drift.lengths")
if c[1].button("Measure vs length", key="drift.len_go", disabled=not lengths):
    out = guarded("Drift vs length", lambda bar: dr.cached_drift_by_length(
        lm, sorted(lengths), skip, cfg, progress=bar, notice=st.warning))
    if out is not None:
        (rows, hit), summary = out
        st.session_state[state.DRIFT_LENGTH] = rows
        st.success("Loaded from the cache." if hit else f"Computed; {summary}.")
rows = st.session_state.get(state.DRIFT_LENGTH)
if rows:
    st.plotly_chart(charts.drift_length_chart(rows), key="drift.length_chart")
    st.caption("Prompts are cut from the built-in texts; block means over the skipped layers.")
