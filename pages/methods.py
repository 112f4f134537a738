"""Methods: every importance method side by side, their agreement, and which one picks the best
prefill skip set."""
import streamlit as st

from dashboard.panels import methods_compare, methods_run, methods_scores, widgets
from dashboard.session import state

st.title("Methods: which layers can POP skip, by every importance method")
st.markdown("The field ranks layers in many ways. Here each method ranks the same prompts' layers "
            "(larger = more important); their rankings are compared with each other and with "
            "**prefill-only drop-one**, POP's own ground truth; then POP runs with the set each "
            "method picks, per budget, on held-out items, beside the **tail** baseline (simply "
            "skip the last layers).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
methods_run.form(lm)
methods_run.stored(lm)

res = st.session_state.get(state.IMPORTANCE)
if res is None:
    st.info("No importance run yet: rank the layers above or load a stored run.")
    st.stop()

st.subheader(f"Per-layer importance — {res.model}, {res.dataset}, {res.n_samples} prompts")
widgets.made_from(state.IMPORTANCE)
if res.n_layers != n:
    st.warning(f"This result is for a {res.n_layers}-layer model; the loaded model has {n}.")
figs = methods_scores.show(lm, res)
methods_compare.form(lm, res)
figs.update(methods_compare.show(lm, res))
methods_scores.downloads(res, st.session_state.get(state.METHOD_COMPARE), figs)
