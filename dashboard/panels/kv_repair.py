"""The closed-form K/V repair on the dashboard (beyond the paper; docs/repair.md).

The Skip set page fits a repair for the shared skip set (with a progress bar, under the
model's run lock) and lists the stored ones; the Generate, Drift and Sweeps pages offer the `pop_repair`
variant only where a stored repair exists for the loaded model and the skip set in use (they
never fit one on their own, except the ratio sweep's missing ratios, which it says first).
"""
from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING

import streamlit as st

from dashboard.panels import widgets
from pop_analysis.engine.pop import RepairError
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import RepairConfig, check_block

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

LABEL = "POP + K/V repair (fitted maps; beyond the paper)"
SHORT = "POP + repair"
DATA = {"builtin": ("built-in prompts", RepairConfig()),
        "gsm8k_train": ("GSM8K train questions with their answers",
                        RepairConfig(data="gsm8k_train", n_samples=96, answers=True))}


def stored_key(lm: LoadedModel, skip) -> str | None:
    """The newest stored repair for this model and skip set (None: pop_repair not offered)."""
    if not skip:
        return None
    found = [e for e in repair_store.entries(lm, skip)  # usable ones only: maps file intact
             if repair_store.unusable(e["key"], e["params"]) is None]
    return found[0]["key"] if found else None


def use_stored(lm: LoadedModel, skip) -> str:
    """Attach the newest stored repair for `skip` (before a pop_repair run); its key."""
    key = stored_key(lm, skip)
    if key is None:
        raise RepairError(f"no stored repair for skip set {describe(skip)}: fit one on the "
                          "Skip set page")
    return repair_store.ensure(lm, skip, key).key


def _fit(lm: LoadedModel, block, cfg: RepairConfig) -> None:
    """Fit (or reuse) a repair with a progress bar; the outcome in one line where the user acted."""
    what = f"Repair of layers {describe(block)}"
    bar = st.progress(0.0, text=f"{what}: starting ...")

    def progress(p) -> None:  # collection, then the ridge fits, each from 0 to 1
        eta = f" · about {p.eta_s:.0f} s left" if p.eta_s is not None else ""
        bar.progress(min(max(p.fraction, 0.0), 1.0),
                     text=f"{what}: {p.message or 'working'} · {p.done}/{p.total}{eta}")

    notes: list[str] = []
    try:
        with widgets.run_lock():
            rep, was_stored = repair_store.fit_and_store(lm, block, cfg, progress,
                                                         notice=notes.append)
    except (ValueError, RuntimeError, OSError) as e:
        st.error(f"{what} failed: {first_line(e)}")
        return
    finally:
        bar.empty()
    for note in notes:
        st.warning(note)
    if was_stored:
        st.success(f"{what}: already stored as {rep.key} (nothing to fit).")
    elif repair_store.unusable(rep.key, {"skip": list(rep.skip)}):  # the store refused it
        st.warning(f"{what}: fitted in {rep.info['seconds']:.0f} s but not stored, so the pages "
                   "cannot offer pop_repair with it; free the cache folder and fit again.")
    else:
        st.success(f"{what}: fitted in {rep.info['seconds']:.0f} s on {rep.info['n_tokens']} "
                   f"distinct tokens and stored as {rep.key}. Generate, Drift and Sweeps now "
                   "offer pop_repair for this skip set.")


def skip_set_panel(lm: LoadedModel, skip) -> None:
    """Fit a repair for the shared skip set (with progress) and list the stored ones."""
    st.subheader("K/V repair (beyond the paper)")
    st.caption("Under POP each skipped layer projects its prompt K/V from the hidden state that "
               "reaches the block instead of its own input. A repair fits, per skipped layer, "
               "ridge maps (closed form, on calibration prompts) from that state to the full "
               "model's K and V; the `pop_repair` variant uses them in the pruned prefill at the "
               "same cost. Weights, x_N and decode are untouched. See docs/repair.md for what it "
               "closes on held-out data.")
    try:
        block = check_block(skip, lm.adapter.n_layers)
    except RepairError as e:
        block = None
        st.info(f"No repair for this skip set: {first_line(e)}.")
    c = st.columns([3, 1, 1], vertical_alignment="bottom")
    data = c[0].selectbox("Calibration data", list(DATA), format_func=lambda k: DATA[k][0],
                          key="repair.data")
    base = DATA[data][1]
    samples = widgets.number(c[1], "Prompts", 8, 1000, value=base.n_samples, key=f"repair.n.{data}")
    go = c[2].button("Fit repair", type="primary", key="repair.go", disabled=block is None or widgets.refused(),
                     help="reuses a stored repair fitted on the same data and settings")
    if go and block is not None:
        _fit(lm, block, dataclasses.replace(base, n_samples=int(samples)))
    rows = repair_store.listing(lm, notice=st.warning)
    if not rows:
        st.caption("No stored repairs for this model yet.")
        return
    mib = sum(p.numel() * p.element_size() for p in lm.model.parameters()) / 2**20
    st.markdown(f"**Stored repairs for this model** ({len(rows)}; the model itself holds "
                f"{mib:.0f} MiB)")
    widgets.table([_row(r, skip) for r in rows], hide_index=True, key="repair.table")
    st.caption("R² of the last skipped layer's K and V on the calibration tokens: plain POP's "
               "projection → the fitted map (leave-one-out). Memory: the maps in float32.")


def _row(r: dict, skip) -> dict:
    (kp, kf), (vp, vf) = r["last_layer_r2"]["k"], r["last_layer_r2"]["v"]
    num = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    return {"skip set": describe(r["skip"]), "current": "✓" if list(skip) == r["skip"] else "",
            "data": r["data"], "distinct tokens": r["n_tokens"],
            "fit time": "–" if r["seconds"] is None else f"{r['seconds']:.1f} s",
            "last layer K R²": f"{num(kp)} → {num(kf)}", "last layer V R²": f"{num(vp)} → {num(vf)}",
            "memory": f"{r['repair_bytes'] / 2**20:.1f} MiB",
            "saved": datetime.datetime.fromtimestamp(r["saved_at"]).strftime("%Y-%m-%d %H:%M"),
            "key": r["key"]}


def sweep_option(lm: LoadedModel, kind: str) -> dict:
    """A checkbox adding pop_repair rows to a ratio or ablation sweep, enabled where stored
    repairs exist for the sweep's skip sets; the SweepConfig fields it sets ({} when off)."""
    from pop_analysis.engine.skipset import last_block, preset
    from pop_analysis.experiments.sweep import SweepConfig

    n, base = lm.adapter.n_layers, SweepConfig()
    if kind == "ablation":
        skips = [preset("paper", n)]
    elif kind == "ratio":
        skips = [s for s in (last_block(n, float(r)) for r in base.ratios) if s]
    else:
        return {}
    keys = {describe(s): stored_key(lm, s) for s in skips}
    missing = [s for s, k in keys.items() if k is None]
    on = st.checkbox("Add pop_repair rows (stored K/V repairs)", key="sw.repair",
                     disabled=len(missing) == len(keys),
                     help="fit a repair on the Skip set page first" if len(missing) == len(keys)
                     else f"stored repairs for layers {', '.join(s for s, k in keys.items() if k)}")
    if not on or len(missing) == len(keys):
        return {}
    if missing:
        st.caption(f"Layers {'; '.join(missing)} have no stored repair yet: the sweep fits one on "
                   "the built-in prompts first (about 20-30 s each on 2 CPU cores).")
    if kind == "ablation":
        return {"variants": base.variants + ("pop_repair",), "repair": keys[describe(skips[0])]}
    return {"repair": "auto"}
