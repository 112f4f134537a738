"""The shared prompt precision: which layers read the prompt in int8, beside the skip set.

One canonical value (INT8), like the skip set's: every widget that shows it is synced from it. A
layer's prompt runs in one precision: a layer the skip set takes is skipped, so it leaves the int8
set when the skip set changes (`int8_for` filters it out); typing it into both is refused.
"""
from __future__ import annotations

import streamlit as st

INT8 = "lab.int8"  # tuple[int, ...]: layers whose prompt positions run their int8 copy
INT8_OF = "lab.int8_n_layers"  # layer count the set was made for (None: from a link)


def int8_for(n_layers: int, skip) -> tuple[int, ...]:
    """The shared int8 set for a model of n_layers, less the skipped layers; () when it was made
    for another model or never set. A set from a link out of range is dropped with a warning."""
    from dashboard.session.state import flash
    from pop_vllm.precision import Precision
    from pop_vllm.run_setting import RunSetting, SettingError

    made_for = st.session_state.get(INT8_OF)
    layers = st.session_state.get(INT8, ())
    if layers and made_for is None:  # from a link: checked now, by the run setting's validator
        try:
            RunSetting(precision=Precision(tuple(layers)), variant="full").check(n_layers)
        except SettingError as e:
            flash("warning", f"The link's int8 layers do not fit this model ({e}); none run in "
                             "int8.")
            layers = ()
        made_for = n_layers
    if made_for != n_layers:
        layers = ()
    st.session_state[INT8], st.session_state[INT8_OF] = tuple(layers), n_layers
    return tuple(i for i in layers if i not in set(skip))


def set_int8(layers, n_layers: int, skip) -> tuple[int, ...]:
    """Check and share a new int8 set beside the skip set; a SettingError (one line, the run
    setting's validator) when a layer is out of range or also skipped."""
    from pop_vllm.precision import Precision
    from pop_vllm.run_setting import RunSetting

    setting = RunSetting(skip, precision=Precision(tuple(layers))).check(n_layers)
    st.session_state[INT8], st.session_state[INT8_OF] = setting.precision.int8, n_layers
    return setting.precision.int8


def precision_for(n_layers: int, skip):
    """The shared int8 layers as a Precision (pop_vllm/precision.py)."""
    from pop_vllm.precision import Precision

    return Precision(int8_for(n_layers, skip))


def from_link(layers) -> None:
    """A link's int8 set, checked against the model once it is known (int8_for)."""
    st.session_state[INT8], st.session_state[INT8_OF] = tuple(layers), None
