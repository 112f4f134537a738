"""Class mode: the stored example results (pop_analysis/store/examples.py) fill every page of a
session that has no result of its own for the loaded model, labelled as examples; the user's own
runs replace them, and `restore` brings one back.

An example passes the same checks as any stored record (the envelope, the record check of its
kind with the model's layer count) and its file's checksum; one that fails is left out with a
notice. Examples are read once per server (st.cache_data) and rebuilt as result objects per
session.
"""
from __future__ import annotations

import streamlit as st

from dashboard.session import state
from pop_analysis.store import examples as ex

KEYS = {"calibration": state.CALIBRATION, "drift": state.DRIFT, "sweep": state.SWEEP,
        "generation": state.GENERATION, "stepthrough": state.STEPTHROUGH,
        "heal_drift": state.HEAL_DRIFT,
        "heal_stepthrough": state.STEPTHROUGH}  # after "stepthrough": a session opens on that one
EXAMPLE = "example"  # the context key that marks a shown result as a stored example
EXAMPLE_KIND = "example kind"  # and which one (two kinds share the step-through's place)
FILLED = "lab.examples_filled"  # models whose examples this session has placed


def _classes() -> dict:
    """kind -> result class (imported when first needed: they import torch)."""
    from pop_analysis.experiments.sweep import SweepResult
    from pop_analysis.importance.calibrate import CalibrationResult
    from pop_analysis.inspection.drift import DriftResult
    from pop_analysis.inspection.heal_drift import HealDrift
    from pop_analysis.inspection.side_by_side import GenerationResult
    from pop_analysis.inspection.stepthrough import StepThrough

    return {"calibration": CalibrationResult, "drift": DriftResult, "sweep": SweepResult,
            "generation": GenerationResult, "stepthrough": StepThrough, "heal_drift": HealDrift,
            "heal_stepthrough": StepThrough}


@st.cache_data(show_spinner=False, max_entries=32)
def stored(model: str, kind: str, n_layers: int | None, checked: bool = True):
    """(Example or None, notices): the shipped example, checked as a record of `kind` when
    `checked` (which imports the result class); only the envelope and checksum otherwise."""
    from pop_analysis.store.records import check

    notes: list[str] = []
    cls = _classes()[kind] if checked else None
    got = ex.load_example(model, kind, lambda p: check(ex.store_kind(kind), cls, p, n_layers),
                          notes.append)
    return got, notes


def result_of(example: ex.Example):
    """The example as the object its page shows (the Generate page and the Drift page's healing
    section keep plain dicts)."""
    obj = _classes()[example.kind].from_dict(example.payload)
    if example.kind == "heal_drift":
        return obj.to_dict()
    return generation_view(obj) if example.kind == "generation" else obj


def generation_view(g) -> dict:
    """A GenerationResult as the Generate page's result dict."""
    from pop_analysis.speed.bench import PrefillSpeed

    return {"model": g.model, "prompt_tokens": len(g.prompt_ids), "full": g.full, "other": g.other,
            "label": g.label, "short": g.short, "prompt_ids": g.prompt_ids, "engine": g.engine,
            "speed": PrefillSpeed.from_dict(g.speed) if g.speed else None,
            "full_text": g.full_text, "other_text": g.other_text}


def context(example: ex.Example) -> dict:
    return {EXAMPLE: example.caption(), "command": example.label["command"],
            EXAMPLE_KIND: example.kind}


def fill(model: str, n_layers: int) -> None:
    """Once per model and session: every page without a result of its own gets the example."""
    done = st.session_state.setdefault(FILLED, set())
    if model in done:
        return
    done.add(model)
    for kind, key in KEYS.items():
        if st.session_state.get(key) is None:
            restore(kind, model, n_layers, quiet=True)


def restore(kind: str, model: str, n_layers: int, quiet: bool = False) -> bool:
    """Show the stored example of `kind` again; False (and a note unless quiet) when none fits."""
    example, notes = stored(model, kind, n_layers)
    for line in notes:
        st.warning(line)
    if example is None:
        if not quiet:
            st.info(f"No stored example of this kind ships for {model}.")
        return False
    state.keep_result(KEYS[kind], result_of(example), context(example))
    return True


def is_example(key: str) -> bool:
    return EXAMPLE in state.context_of(key)


def shown_kind(key: str) -> str | None:
    """The example kind shown under `key` (None for the user's own result)."""
    ctx = state.context_of(key)
    return ctx.get(EXAMPLE_KIND) if EXAMPLE in ctx else None


def has_example(kind: str, model: str, n_layers: int) -> bool:
    return stored(model, kind, n_layers)[0] is not None


def offer_back(kind: str, model: str, n_layers: int, where=None,
               label: str = "Show the stored example again") -> None:
    """Under any result but this example: a button that shows the stored example of `kind` (the
    user's run stays in the results store, one Load away)."""
    if shown_kind(KEYS[kind]) == kind or not has_example(kind, model, n_layers):
        return
    (where or st).button(label, key=f"example.{kind}",
                         on_click=restore, args=(kind, model, n_layers),
                         help="the example shipped with POP Lab; your run stays in the results "
                              "store (Load it again from the stored runs)")
