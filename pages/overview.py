"""Overview: what POP is, how to read every plot, what runs where, the model card."""
import streamlit as st

from dashboard.charts import layers as layer_charts
from dashboard.panels import exports, widgets
from dashboard.session import state

st.title("Prefill-Only Pruning (POP)")
st.markdown("""
A decoder reads a prompt (**prefill**) and then writes an answer one token at a time (**decode**).
POP's observation: the deep layers matter far more for *decoding* than for *reading the prompt*.
So while it reads x₁..x_(N-1) it skips the attention and FFN of a block of deep layers (the paper
skips the **last third**) and keeps only each skipped layer's **independent K/V projection** of the
hidden state reaching it, so every layer's KV cache stays complete. The last prompt token x_N
(**boundary handling**) and every generated token then run through the **full** model.
Weights never change; the time to the first token (TTFT) falls.

One engineering detail of this tool: layers *below* the first skipped layer see exactly the same
inputs with or without POP, so x_N travels through them together with the prompt, and the boundary
step re-runs only the layers from the first skipped one on. It is the same computation the full
model does for x_N, at a third of the boundary cost for the paper's last-third skip set.
""")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
skip = state.skip_for(n)

st.subheader("What runs where")
diagram = layer_charts.pop_diagram(n, skip)
st.plotly_chart(diagram, key="overview.diagram")
st.caption("Rows are layers, columns positions. Orange cells run only the K/V projection "
           "(≈ a few % of a layer), blue cells the full layer. The skip set is the one chosen on "
           "the *Skip set* page and shown in the sidebar.")

with st.expander("How to read each page", expanded=True):
    st.markdown("""
- **Calibrate**: per-layer importance E[(dL/dg)²] of a virtual gate on each layer, measured
  separately for prefill positions and decode positions on responses the model samples itself.
  Blue = prefill, orange = decode; bands are ±1 standard deviation over samples; a log axis helps.
  Layers where prefill importance is tiny are the ones POP can skip while reading the prompt.
- **Skip set**: the layer strip (hatched = skipped) coloured by prefill importance once a
  calibration exists; the ideal speedup is the ratio of prefill FLOPs, full vs POP.
- **Generate**: the full model and a POP variant answer the same prompt side by side; TTFT,
  decode tokens/s, token agreement, the first divergent token (highlighted) and per-layer call
  counts that prove skipped layers ran no attention/FFN in prefill, only k_proj.
- **Drift**: cosine similarity between POP's and the full model's hidden states, K and V cache
  entries, and decode-time attention outputs per layer; the paper expects hidden and V to drift
  while the attention output stays close to 1.
- **Sweeps**: speed vs quality across skip ratios, the paper's ablations and input lengths, each
  beside the paper's own numbers.
""")

st.subheader("Model card")
card = lm.card()
rows = [{"field": k, "value": str(v)} for k, v in card.items()]
st.dataframe(rows, hide_index=True, key="overview.card", width="stretch",
             column_config={"field": st.column_config.TextColumn(width="small"),
                            "value": st.column_config.TextColumn(width="large")})
exports.offer("overview", data=card, rows=rows, figures={"pop_diagram": diagram})
