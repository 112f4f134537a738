"""One model instance per (name, device, dtype), shared by every page and session."""
from __future__ import annotations

import threading

import streamlit as st

from pop_analysis.models import load_model


@st.cache_resource(show_spinner=False, max_entries=2)
def shared_model(name: str, device: str | None, dtype: str | None):
    """Load once; later calls from any page or session get the same instance."""
    return load_model(name, device=device, dtype=dtype)


@st.cache_resource(show_spinner=False)
def model_lock(name: str, device: str | None, dtype: str | None) -> threading.Lock:
    """Serialises runs on one model so two sessions never interleave inside it."""
    return threading.Lock()
