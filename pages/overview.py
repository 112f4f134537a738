"""Overview: what POP is, where to start, a recorded run of what runs where, the model card.

The text and the recorded run (the session's step-through, else the stored example) need no
model: they appear at once while the model loads in the background.
"""
import streamlit as st

from dashboard.charts import stepthrough as step_charts
from dashboard.panels import exports, presenter, widgets
from dashboard.session import classmode, state
from pop_analysis.inspection.step_frames import frames, position_tokens

st.title("Prefill-Only Pruning (POP)")
st.markdown("""
A decoder reads a prompt (**prefill**) and then writes an answer one token at a time (**decode**).
POP's observation (He et al., 2026): the deep layers matter far more for *decoding* than for
*reading the prompt*. So while it reads x₁..x_(N-1) it skips the attention and FFN of a block of
deep layers (the paper skips the **last third**) and keeps only each skipped layer's
**independent K/V projection** of the hidden state reaching it, so every layer's KV cache stays
complete. The last prompt token x_N (**boundary handling**) and every generated token then run
through the **full** model. Weights never change; the time to the first token (TTFT) falls.
""")

with st.container(border=True):
    st.markdown("**Start here** (every page opens with a stored example run, labelled as such; "
                "your own runs replace them)")
    c = st.columns(3)
    c[0].page_link("../pages/stepthrough.py", label="1 · Step through one prompt", icon=":material/slideshow:")
    c[0].caption("What each layer computes, step by step, on one clock for both models.")
    c[1].page_link("../pages/calibrate.py", label="2 · Which layers matter when", icon=":material/insights:")
    c[1].caption("Prefill vs decode importance of every layer.")
    c[2].page_link("../pages/generate.py", label="3 · Full vs POP on your prompt", icon=":material/chat:")
    c[2].caption("Answers side by side, the measured speedup, where they part.")
    st.caption("Then: **Skip set** (choose the layers), **Drift** (how far POP's states move), "
               "**Sweeps** (speed and quality over ratios, beside the paper), **Serve** (POP in "
               "vLLM). Keys: ← → and space on *Step through*; PageDown / PageUp change page.")

spec = state.model_spec()
rec = st.session_state.get(state.STEPTHROUGH)
steps, about = None, None
if rec is not None and rec.model == spec.name:  # the session's: the user's run, or the example
    shown = state.context_of(state.STEPTHROUGH).get(classmode.EXAMPLE)
    steps, about = rec.steps, (shown.replace("Stored example", "the stored example", 1) if shown
                               else f"your step-through of {rec.model}")
    tokens, n_layers = rec.tokens, rec.n_layers
else:
    example, _ = classmode.stored(spec.name, "stepthrough", None, checked=False)
    if example is not None:
        p = example.payload
        steps, about = p["steps"], example.caption().replace("Stored example", "the stored example", 1)
        tokens, n_layers = p["tokens"], p["n_layers"]
st.subheader("What runs where: POP's pruned prefill, recorded")
figures = {}
if steps:
    frame = frames(steps)[1]
    labels = step_charts.position_labels(tokens, position_tokens(steps))
    figures["what_runs_where"] = step_charts.step_grid(frame["shown"], frame["earlier"], n_layers,
                                                       labels, frame["title"])
    presenter.plot(figures["what_runs_where"], key="overview.grid")
    st.caption(f"From {about}: blue cells ran attention and FFN, orange cells only the K/V "
               "projection (the hidden state passes the layer unchanged). The **Step through** "
               "page plays every step, with the K/V cache, the FLOPs and the time of each.")
else:
    st.info(f"No stored step-through ships for {spec.name}: run one on the Step through page.")

lm = widgets.model_or_stop()
with st.expander("How to read each page", expanded=not state.presenting()):
    st.markdown("""
- **Calibrate**: per-layer importance E[(dL/dg)²] of a virtual gate on each layer, measured
  separately for prefill positions and decode positions on responses the model samples itself.
  Blue = prefill, orange = decode; bands are 95% intervals of the mean over samples.
- **Skip set**: the layer strip (crossed = skipped) coloured by prefill importance; the ideal
  speedup is the ratio of prefill FLOPs, full vs POP.
- **Generate**: the full model and a POP variant answer the same prompt side by side; the
  measured prefill speedup, token agreement, where they part, and per-layer call counts.
- **Drift**: cosine similarity between POP's and the full model's hidden states, K and V cache
  entries and decode-time attention outputs, against the paper's reference values.
- **Sweeps**: speed vs quality across skip ratios, the paper's ablations and input lengths,
  each beside the paper's own numbers.
""")
if not state.presenting():
    st.subheader("Model card")
    card = lm.card()
    rows = [{"field": k, "value": str(v)} for k, v in card.items()]
    st.dataframe(rows, hide_index=True, key="overview.card", width="stretch",
                 column_config={"field": st.column_config.TextColumn(width="small"),
                                "value": st.column_config.TextColumn(width="large")})
    exports.offer("overview", data=card, rows=rows, figures=figures)
