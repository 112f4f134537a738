"""Session state: the keys every page shares and the typed spec they are read through.

Widgets keep their own (page-local) keys; the values that must survive a page switch live under
the canonical keys below and are written only through these helpers.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

MODEL = "lab.model"  # ModelSpec of the model the user asked for (last one that loaded)
SKIP = "lab.skip"  # tuple[int, ...]: the chosen skip set, shared by every page
SKIP_LAYERS_OF = "lab.skip_n_layers"  # layer count the skip set was made for
UNLOADED = "lab.unloaded"  # True after "unload model" until the next load
CALIBRATION = "lab.calibration"  # the last CalibrationResult shown (computed or reloaded)
GENERATION = "lab.generation"  # the last side-by-side generation (dict), kept across pages
DRIFT = "lab.drift"  # the last DriftResult
DRIFT_LENGTH = "lab.drift_by_length"  # the last drift-vs-length rows (list[dict])
SWEEP = "lab.sweep"  # the last SweepResult shown
MESSAGE = "lab.message"  # one-shot (level, text) shown where the user acted, after a rerun


@dataclass(frozen=True)
class ModelSpec:
    """Which model to run and where."""

    name: str  # registry name, hub id or local directory
    device: str | None = None  # None = cuda when present, else cpu
    dtype: str | None = None  # None = bfloat16 on cuda, float32 on cpu

    @property
    def key(self) -> tuple:
        return (self.name, self.device, self.dtype)


def model_spec() -> ModelSpec:
    from pop_analysis.models import DEFAULT_MODEL

    return st.session_state.setdefault(MODEL, ModelSpec(DEFAULT_MODEL))


def set_model_spec(spec: ModelSpec) -> None:
    st.session_state[MODEL] = spec


def skip_for(n_layers: int) -> tuple[int, ...]:
    """The shared skip set; made (the paper's last third) for a model whose layer count it lacks."""
    from pop_analysis.skipset import preset

    if st.session_state.get(SKIP_LAYERS_OF) != n_layers or SKIP not in st.session_state:
        st.session_state[SKIP] = preset("paper", n_layers)
        st.session_state[SKIP_LAYERS_OF] = n_layers
    return st.session_state[SKIP]


def set_skip(layers, n_layers: int) -> tuple[int, ...]:
    """Validate and share a new skip set; raises SkipSetError for an impossible one."""
    from pop_analysis.skipset import validate

    out = validate(layers, n_layers)
    st.session_state[SKIP] = out
    st.session_state[SKIP_LAYERS_OF] = n_layers
    return out


def flash(level: str, text: str) -> None:
    """Remember a message to show after the next rerun (callbacks cannot draw in place)."""
    st.session_state[MESSAGE] = (level, text)


def show_flash(where=st) -> None:
    msg = st.session_state.pop(MESSAGE, None)
    if msg:
        getattr(where, msg[0])(msg[1])
