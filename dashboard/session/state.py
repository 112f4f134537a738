"""Session state: the keys every page shares and the typed spec they are read through.

One canonical value per fact. The skip set lives under SKIP alone: every widget that shows it
(slider, presets, strip, layer buttons, sidebar box) is re-synced from it before it is drawn
(`sync`) and writes it only through callbacks (`set_skip`), which run before the script, so a
change from any of them shows everywhere in the same run.

Inputs that must survive a page change (prompt, variant, data set, sweep settings) are widgets
whose key is registered with `kept(key, default)`: Streamlit drops a widget's state when its
page is not drawn, so app.py copies every registered widget value to a canonical "keep." key at
the start of each run (`remember_inputs`) and `kept` restores it when the widget is drawn again.
Every number box's key goes through `kept`, which is also where a value that is no finite number
(NaN, infinity, a string) is refused: one error line, the box back at its default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import streamlit as st

from pop_analysis.errors import shown

MODEL = "lab.model"  # ModelSpec of the model the user asked for (last one that loaded)
SKIP = "lab.skip"  # tuple[int, ...]: the chosen skip set, shared by every page
SKIP_LAYERS_OF = "lab.skip_n_layers"  # layer count the skip set was made for (None: from a link)
UNLOADED = "lab.unloaded"  # True after "unload model" until the next load
CALIBRATION = "lab.calibration"  # the last CalibrationResult shown (computed or reloaded)
GENERATION = "lab.generation"  # the last side-by-side generation (dict), kept across pages
DRIFT = "lab.drift"  # the last DriftResult
DRIFT_B = "lab.drift_b"  # a second DriftResult shown beside it (compare)
DRIFT_LENGTH = "lab.drift_by_length"  # the last drift-vs-length rows (list[dict])
SWEEP = "lab.sweep"  # the last SweepResult shown
IMPORTANCE = "lab.importance"  # the last ImportanceResult shown (Methods page)
METHOD_COMPARE = "lab.method_compare"  # the last ComparisonResult of the methods' skip sets
CHOICE = "lab.choice"  # the last ChoiceResult (Skip set page: the budgeted choice)
CERTIFICATE = "lab.certificate"  # the last CertifyResult (Skip set page: the certified choice)
STEPTHROUGH = "lab.stepthrough"  # the last StepThrough shown
HEAL_DRIFT = "lab.heal_drift"  # the last drift-while-healing result (HealDrift as a dict)
RESULTS = (CALIBRATION, GENERATION, DRIFT, DRIFT_B, DRIFT_LENGTH, SWEEP, STEPTHROUGH, IMPORTANCE,
           METHOD_COMPARE, CHOICE, CERTIFICATE, HEAL_DRIFT)
SHOWN_FOR = "lab.results_model"  # the model whose results RESULTS hold now
ARCHIVE = "lab.results_by_model"  # model -> {key: (result, context)} of the other models
PRESENT = "lab.present"  # True in the presenter's view (large type, fewer controls)
CONTEXT = "lab.context."  # + result key: the settings a result came from (dict)
MESSAGE = "lab.message"  # one-shot (level, text) shown where the user acted, after a rerun
KEEP = "keep."  # + widget key: the canonical copy of a kept input
KEPT = "lab.kept"  # set of widget keys registered with kept()
URL_READ = "lab.url_read"  # True once this session's link (query parameters) was applied
LINK_SKIP_ERROR = "lab.link_skip_error"  # why the link's ?skip= was refused; until a set is chosen
LINK_ERROR = "lab.link_error"  # why the link's model was refused; shown until a model is loaded


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
    from pop_analysis.engine.models import DEFAULT_MODEL

    return st.session_state.setdefault(MODEL, ModelSpec(DEFAULT_MODEL))


def set_model_spec(spec: ModelSpec) -> None:
    st.session_state[MODEL] = spec


# ---------- the skip set ----------

def skip_for(n_layers: int) -> tuple[int, ...]:
    """The shared skip set; made (the paper's last third) for a model whose layer count it lacks.
    A set that came from a link is checked against the model here (an impossible one is replaced
    by the paper's and the reason flashed)."""
    from pop_analysis.engine.skipset import describe, preset
    from pop_vllm.run_setting import RunSetting, SettingError

    made_for = st.session_state.get(SKIP_LAYERS_OF)
    if SKIP in st.session_state and made_for is None:  # from a link: check it now
        try:
            st.session_state[SKIP] = RunSetting(st.session_state[SKIP]).check(n_layers).skip
            st.session_state[SKIP_LAYERS_OF] = made_for = n_layers
        except SettingError as e:
            refuse_link_skip(describe(st.session_state[SKIP]), str(e))
    if made_for != n_layers or SKIP not in st.session_state:
        st.session_state[SKIP] = preset("paper", n_layers)
        st.session_state[SKIP_LAYERS_OF] = n_layers
    return st.session_state[SKIP]


def set_skip(layers, n_layers: int) -> tuple[int, ...]:
    """Validate and share a new skip set; raises SettingError for an impossible one."""
    from pop_vllm.run_setting import RunSetting

    out = RunSetting(layers).check(n_layers).skip
    st.session_state.pop(LINK_SKIP_ERROR, None)  # the user chose: the link's refusal is over
    st.session_state[SKIP] = out
    st.session_state[SKIP_LAYERS_OF] = n_layers
    return out


def sync(key: str, value) -> None:
    """Set a widget's value from the canonical state before the widget is drawn."""
    st.session_state[key] = value


# ---------- inputs that survive page changes ----------

def kept(key: str, default=None, options=None) -> str:
    """Register a widget key as kept across pages and restore its value; returns the key.
    Pass no `value=`/`index=` to the widget itself: the default lives here. With `options`
    (a select widget), a kept choice that is no longer offered is dropped."""
    st.session_state.setdefault(KEPT, set()).add(key)
    if key not in st.session_state:
        value = st.session_state.get(KEEP + key, default)
        if value is not None:
            st.session_state[key] = value
    if is_number(default) and key in st.session_state and not finite(st.session_state[key]):
        # A number box's value that is no finite number (NaN never compares greater: a bound
        # check lets it through) is reset before the widget shows it, with one line below it.
        st.error(f"{shown(st.session_state[key])} is not a finite number: reset to {default}.")
        st.session_state[key] = default
    if options is not None and key in st.session_state:
        v = st.session_state[key]
        if isinstance(v, list):
            st.session_state[key] = [x for x in v if x in options]
        elif v not in options:
            st.session_state[key] = default
    return key


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v) -> bool:
    return is_number(v) and math.isfinite(v)


def remember_inputs() -> None:
    """Copy every kept widget's current value to its canonical key (app.py, each run)."""
    for key in st.session_state.get(KEPT, ()):
        if key in st.session_state:
            st.session_state[KEEP + key] = st.session_state[key]


def value(key: str, default=None):
    """A kept input's value, whether or not its widget is drawn on this page."""
    return st.session_state.get(key, st.session_state.get(KEEP + key, default))


# ---------- results and the settings they came from ----------

def keep_result(key: str, result, context: dict, model: str | None = None) -> None:
    """Show `result` under `key` with the settings it came from; one made for another model
    (a background run that finished after a switch) goes to that model's results instead."""
    shown = st.session_state.get(SHOWN_FOR)
    if model is not None and shown is not None and model != shown:
        st.session_state.setdefault(ARCHIVE, {}).setdefault(model, {})[key] = (result, dict(context))
        return
    st.session_state[key] = result
    st.session_state[CONTEXT + key] = dict(context)


def follow_model(name: str) -> None:
    """Results belong to the model they were made with: when the session's model changes, the
    shown results are put away under the old model and the new model's come back (none is ever
    drawn through another model's tokenizer or layer count)."""
    ss = st.session_state
    old = ss.get(SHOWN_FOR)
    if old == name:
        return
    archive = ss.setdefault(ARCHIVE, {})
    if old is not None:
        archive[old] = {k: (ss.pop(k), ss.pop(CONTEXT + k, {})) for k in RESULTS if k in ss}
    for k in RESULTS:
        ss.pop(k, None)
        ss.pop(CONTEXT + k, None)
    for k, (result, context) in archive.pop(name, {}).items():
        ss[k], ss[CONTEXT + k] = result, context
    ss[SHOWN_FOR] = name


def results_by_model() -> dict:
    """model -> {key: (result, context)}: the shown model's results and the put-away ones."""
    ss = st.session_state
    out = {m: dict(r) for m, r in ss.get(ARCHIVE, {}).items()}
    shown = ss.get(SHOWN_FOR)
    if shown is not None:
        out[shown] = {k: (ss[k], context_of(k)) for k in RESULTS if ss.get(k) is not None}
    return {m: r for m, r in out.items() if r}


def presenting() -> bool:
    return bool(st.session_state.get(PRESENT))


def context_of(key: str) -> dict:
    return st.session_state.get(CONTEXT + key) or {}


def changed(key: str, now: dict) -> list[str]:
    """Names of the settings that differ between a kept result's context and `now`."""
    then = context_of(key)
    return [k for k, v in now.items() if k in then and then[k] != v]


# ---------- messages ----------

def refuse_link_skip(text: str, reason: str) -> None:
    """A link's ?skip= that cannot be used: named in one line on every page until a skip set
    is chosen (the default stands in meanwhile, and the line says so)."""
    st.session_state[LINK_SKIP_ERROR] = (f"The link's skip set {text!r} is refused: {reason}. "
                                         "Showing the paper's last third until you choose one.")


def link_skip_error() -> str | None:
    return st.session_state.get(LINK_SKIP_ERROR)


def flash(level: str, text: str) -> None:
    """Remember a message to show after the next rerun (callbacks cannot draw in place)."""
    st.session_state[MESSAGE] = (level, text)


def show_flash(where=st) -> None:
    msg = st.session_state.pop(MESSAGE, None)
    if msg:
        getattr(where, msg[0])(msg[1])
