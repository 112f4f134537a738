"""Skip set: ratio slider, presets, clickable layer strip, layer buttons, live ideal speedup.

Every control writes the one shared skip set (state.SKIP) in a callback and is re-synced from it
before it is drawn, so a change from any of them (or from the sidebar box) shows everywhere.
"""
import streamlit as st

from dashboard.charts import layers as layer_charts
from dashboard.panels import (exports, kv_repair, precision_controls, presenter, skip_set_budget,
                              skip_set_certify, widgets)
from dashboard.session import state
from pop_analysis.engine.skipset import describe, last_block, preset
from pop_analysis.importance.calibrate import suggest_skip
from pop_analysis.speed.flops import ideal_speedup, prefill_flop_share
from pop_vllm.run_setting import RunSetting, SettingError

STRIP_V = "lab.strip_version"  # bumped after each strip pick: a fresh chart holds no selection

st.title("Skip set")
st.markdown("Choose which layers POP skips while reading the prompt. The choice is shared with "
            "every page (see the sidebar, where it can also be typed).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
shape = lm.adapter.shape
calib = st.session_state.get(state.CALIBRATION)
scores = calib.prefill if calib is not None and calib.n_layers == n else None


def apply(layers, label: str) -> None:
    try:
        state.set_skip(layers, n)
        state.flash("success", f"Skip set: {label} → layers {describe(state.skip_for(n))}")
    except SettingError as e:
        state.flash("error", f"Skip set unchanged: {e}")


def on_ratio() -> None:
    k = st.session_state["skipset.k"]
    apply(last_block(n, k / n), f"last {k} layers")


def on_pills() -> None:
    apply(st.session_state["skipset.pills"] or (), "hand-picked")


def on_preset(name: str, label: str) -> None:
    apply(preset(name, n), label)


def on_adaptive() -> None:
    try:
        k = max(len(state.skip_for(n)), 1)
        apply(suggest_skip(calib, n_skip=k)["adaptive"].layers, "adaptive (lowest prefill importance)")
    except ValueError as e:
        state.flash("error", f"Adaptive selection failed: {e}")


def on_strip(key: str) -> None:
    """A click toggles the clicked layer; a box replaces the set with the boxed layers."""
    sel = st.session_state[key].selection
    picked = sorted({int(p["x"]) for p in sel.points})
    if not picked:
        return
    if sel.box or sel.lasso:
        apply(picked, "box on the strip (replaces the set)")
    else:
        skip = set(state.skip_for(n))
        apply(sorted(skip ^ set(picked)), f"layer {describe(picked)} toggled on the strip")
    st.session_state[STRIP_V] = st.session_state.get(STRIP_V, 0) + 1


skip = state.skip_for(n)
tail = skip == last_block(n, len(skip) / n) if skip else True
state.sync("skipset.k", len(skip))  # the widgets mirror the shared set
state.sync("skipset.pills", list(skip))

st.select_slider("Skip ratio (the deepest layers, as in the paper)", options=list(range(n)),
                 format_func=lambda k: f"{k / n:.0%} · {k} layers", key="skipset.k",
                 on_change=on_ratio, help="sets a contiguous tail; presets and clicks below refine it")
st.caption("The current set is not a contiguous tail; the slider shows its size only." if not tail
           else "The slider sets a contiguous tail of the deepest layers.")  # one line either way

st.write("Presets")
cols = st.columns(5)
cols[0].button("Paper: last third", key="skipset.paper", width="stretch", on_click=on_preset,
               args=("paper", "the paper's last third"))
cols[1].button("Adaptive from scores", key="skipset.adaptive", width="stretch",
               disabled=scores is None, on_click=on_adaptive,
               help="as many layers as now, those with the lowest prefill importance "
                    "(calibrate first)")
for col, name in zip(cols[2:], ("shallow", "interleaved", "none")):
    col.button(name.capitalize(), key=f"skipset.{name}", width="stretch", on_click=on_preset,
               args=(name, name))

st.subheader("Layers")
strip_key = f"skipset.strip.{st.session_state.get(STRIP_V, 0)}"
fig = layer_charts.layer_strip(n, skip, scores)
presenter.plot(fig, key=strip_key, on_select=lambda: on_strip(strip_key),
               selection_mode=("points", "box"), config={"displayModeBar": True})
state.show_flash()  # below the strip: a message never moves the squares under the pointer
st.caption("**Click** a square to toggle that layer. For a range, pick the **box tool** (the "
           "dotted square, top right of the strip) and drag over squares: the boxed layers "
           "**replace** the skip set. The buttons below toggle single layers. "
           + ("Colour = prefill importance from the last calibration (log scale)."
              if scores is not None else "Calibrate first to colour the strip by importance."))
st.pills("Toggle layers", options=list(range(n)), selection_mode="multi", key="skipset.pills",
         on_change=on_pills)

st.subheader("What it buys")
c = st.columns(4)
c[0].metric("Layers skipped", f"{len(skip)} / {n}", describe(skip), delta_color="off")
pop = RunSetting(skip)
for col, length in zip(c[1:3], (128, 2048)):
    col.metric(f"Ideal prefill speedup @ {length} tok", f"{ideal_speedup(shape, length, pop):.2f}×")
c[3].metric("Prefill FLOPs still spent @ 512 tok", f"{prefill_flop_share(shape, 512, pop):.1%}")
st.caption("Ideal = full prefill FLOPs / POP prefill FLOPs (matmuls only; the boundary token x_N "
           "runs all layers). Measured speedups on the Generate and Sweeps pages reach 75-95% of "
           "it in the paper.")

rows = [{"layer": i, "skipped": i in skip, "prefill_importance": scores[i] if scores else None}
        for i in range(n)]
exports.offer("skip_set", data={"model": lm.name, "n_layers": n, "skip": list(skip),
                                "layers": rows},
              rows=rows, figures={"layer_strip": fig})

precision_controls.section(lm, skip)  # int8 prompt layers beside the skip set, the frontier
skip_set_budget.section(lm)  # the largest set within a quality budget
skip_set_certify.section(lm)  # a set certified on items the search never saw
kv_repair.skip_set_panel(lm, skip)  # beyond the paper: fit and list K/V repairs
