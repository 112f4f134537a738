"""The same chart for every embedded model in one click: the newest stored calibration or sweep
of each, found in the results store (the CLI's runs and the dashboard's alike)."""
from __future__ import annotations

import streamlit as st

from dashboard.session import cached, state
from pop_analysis.engine.models import REGISTRY

MODELS_SHOWN = "cal.models_compare"  # the calibrate page shows the by-depth chart of all models


def newest(entries: list[dict], model: str, kind: str | None = None) -> str | None:
    """Key of the newest stored entry of `model` (and sweep `kind`); entries are newest first."""
    for e in entries:
        p = e.get("params") or {}
        if p.get("model") == model and (kind is None or p.get("kind") == kind):
            return e["key"]
    return None


def calibration_curves(entries: list[dict]) -> tuple[list[dict], list[str]]:
    """({label, prefill, decode} of each embedded model's newest calibration, models without)."""
    from pop_analysis.importance.calibrate import KIND

    curves, missing = [], []
    for name, entry in REGISTRY.items():
        key = newest(entries, name)
        got = cached.importance_curves(KIND, key) if key else None
        if got is None:
            missing.append(entry.short)
        else:
            curves.append({"label": f"{entry.short} ({len(got[0])} layers)", "prefill": got[0],
                           "decode": got[1]})
    return curves, missing


def overlay_other_models(entries: list[dict]) -> None:
    """Callback: overlay the newest stored sweep of the shown kind of every other embedded model."""
    res = st.session_state.get(state.SWEEP)
    if res is None:
        return
    keys = [k for name in REGISTRY if name != res.model
            for k in [newest(entries, name, res.kind)] if k]
    missing = [REGISTRY[n].short for n in REGISTRY
               if n != res.model and not newest(entries, n, res.kind)]
    st.session_state["sw.overlay"] = keys
    if missing:
        state.flash("info", f"No stored {res.kind} sweep of {', '.join(missing)} yet: run one "
                            "(Sweeps page, or python -m pop_analysis sweep --model NAME).")
