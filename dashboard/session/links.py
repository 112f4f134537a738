"""Shareable links: the model and the skip set live in the URL's query parameters (the page is
the URL path, /calibrate, /generate, ...), so a copied link reopens the same view.

`apply_link()` reads them once per session (the first run); `write_link()` writes the current
values on every run, so the address bar always holds a link to what is on screen.
"""
from __future__ import annotations

import os

import streamlit as st

from dashboard.session import precision_state, state
from pop_analysis.data.allowed_paths import PathNotAllowed, check_model
from pop_analysis.engine.embedded import REGISTRY
from pop_analysis.engine.skipset import describe, parse_layers
from pop_vllm.run_setting import SettingError

# the sidebar form's radio labels: one per embedded model (by registry name), hub, local
SOURCE_KEYS = {**{name: f"Embedded ({e.short}, offline)" for name, e in REGISTRY.items()},
               "hub": "Hugging Face hub id", "local": "Local directory"}


def skip_text(skip) -> str:
    """(3, 20, ..., 29) -> '3,20-29'; () -> 'none' (the URL form, no spaces)."""
    return describe(skip).replace(" ", "")


def parse_skip(text: str) -> tuple[int, ...]:
    text = text.strip().lower()
    return () if text in ("", "none") else parse_layers(text)


PRESENT = "present"  # ?present=1: the presenter's view
PAGE_PARAMS = {"stepthrough": ("step",)}  # parameters one page owns (cleared on the others)


def presenting_link() -> bool:
    return st.query_params.get(PRESENT) in ("1", "true", "yes")


def apply_link() -> None:
    """First run of a session: take model, device, dtype, skip set and the presenter's view
    from the query string."""
    if st.session_state.get(state.URL_READ):
        return
    st.session_state[state.URL_READ] = True
    q = st.query_params
    st.session_state[state.PRESENT] = presenting_link()
    name = q.get("model")
    if name:
        try:
            check_model(name)
        except PathNotAllowed as e:  # the model box's words: nothing tells whether it exists
            st.session_state[state.LINK_ERROR] = f"The link's model is not loaded: {e}"
            name = None
    if name:
        spec = state.ModelSpec(name, q.get("device") or None, q.get("dtype") or None)
        state.set_model_spec(spec)
        _fill_model_form(spec)
    if "skip" in q:
        try:
            st.session_state[state.SKIP] = parse_skip(q["skip"])
            st.session_state[state.SKIP_LAYERS_OF] = None  # checked once the model is known
        except SettingError as e:
            state.refuse_link_skip(q["skip"], str(e))
    if "int8" in q:
        try:
            precision_state.from_link(parse_skip(q["int8"]))
        except SettingError as e:
            state.flash("warning", f"The link's int8 layers are not readable ({e}); none run in "
                                   "int8.")


def _fill_model_form(spec: state.ModelSpec) -> None:
    if spec.name in REGISTRY:
        source = spec.name
    else:
        source = "local" if os.path.isdir(spec.name) or spec.name.startswith(("/", ".")) else "hub"
        st.session_state["w.model_name"] = spec.name
    st.session_state["w.model_source"] = SOURCE_KEYS[source]
    st.session_state["w.device"] = spec.device or "auto"
    st.session_state["w.dtype"] = spec.dtype or "auto"


def write_link(skip=None, page: str | None = None, int8=()) -> str:
    """Put the current model, skip set and presenter's view in the address bar (no rerun), and
    drop the parameters of pages other than `page`; returns the query."""
    spec = state.model_spec()
    want = {"model": spec.name, "device": spec.device, "dtype": spec.dtype,
            "skip": None if skip is None else skip_text(skip),
            "int8": skip_text(int8) if int8 else None,
            PRESENT: "1" if state.presenting() else None}
    want.update({k: None for p, keys in PAGE_PARAMS.items() if p != page for k in keys})
    q = st.query_params
    for k, v in want.items():
        if v is None:
            if k in q:
                del q[k]
        elif q.get(k) != v:
            q[k] = v
    return "&".join(f"{k}={v}" for k, v in want.items() if v is not None)
