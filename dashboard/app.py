"""POP Lab dashboard: entry point (`streamlit run dashboard/app.py`)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from dashboard.resources import shared_model  # noqa: E402
from pop_analysis.models import DEFAULT_MODEL, ModelLoadError  # noqa: E402

st.set_page_config(page_title="POP Lab", page_icon="✂️", layout="wide")
st.title("POP Lab — Prefill-Only Pruning")

name = st.sidebar.text_input("Model", value=DEFAULT_MODEL,
                             help="registry name, Hugging Face hub id, or local directory")
try:
    with st.spinner(f"Loading {name} ..."):
        lm = shared_model(name, None, None)
except ModelLoadError as e:
    st.error(str(e))
    st.stop()

st.subheader("Model card")
st.table({k: [str(v)] for k, v in lm.card().items()})
