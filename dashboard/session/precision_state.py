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

    made_for = st.session_state.get(INT8_OF)
    layers = st.session_state.get(INT8, ())
    if layers and made_for is None:  # from a link: check it now
        bad = [i for i in layers if not 0 <= i < n_layers]
        if bad:
            flash("warning", f"The link's int8 layers {bad[:8]} do not fit this model's "
                             f"{n_layers} layers; none run in int8.")
            layers = ()
        made_for = n_layers
    if made_for != n_layers:
        layers = ()
    st.session_state[INT8], st.session_state[INT8_OF] = tuple(layers), n_layers
    return tuple(i for i in layers if i not in set(skip))


def set_int8(layers, n_layers: int, skip) -> tuple[int, ...]:
    """Check and share a new int8 set; PrecisionError (one line) when a layer is out of range or
    also skipped."""
    from pop_analysis.engine.precision import Precision, PrecisionError
    from pop_analysis.engine.skipset import describe

    out = Precision(tuple(layers)).int8
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise PrecisionError(f"int8 layer(s) {describe(bad)} out of range: the model has layers "
                             f"0..{n_layers - 1}")
    both = sorted(set(out) & set(skip))
    if both:
        raise PrecisionError(f"layer(s) {describe(both)} both skipped and int8: a layer's prompt "
                             "runs in one precision (full, int8 or skip)")
    st.session_state[INT8], st.session_state[INT8_OF] = out, n_layers
    return out


def precision_for(n_layers: int, skip):
    """The shared setting as an engine Precision."""
    from pop_analysis.engine.precision import Precision

    return Precision(int8_for(n_layers, skip))


def from_link(layers) -> None:
    """A link's int8 set, checked against the model once it is known (int8_for)."""
    st.session_state[INT8], st.session_state[INT8_OF] = tuple(layers), None
