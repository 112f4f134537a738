"""Skip set: ratio slider, presets, clickable layer strip, live ideal speedup and FLOP share."""
import streamlit as st

from dashboard import charts, repair_panel, state, widgets
from pop_analysis.calibrate import suggest_skip
from pop_analysis.flops import ideal_speedup, prefill_flop_share
from pop_analysis.skipset import SkipSetError, describe, last_block, preset

st.title("Skip set")
st.markdown("Choose which layers POP skips while reading the prompt. The choice is shared with "
            "every page (see the sidebar).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
shape = lm.adapter.shape
calib = st.session_state.get(state.CALIBRATION)
scores = calib.prefill if calib is not None and calib.n_layers == n else None


def apply(layers, label: str) -> None:
    try:
        state.set_skip(layers, n)
        state.flash("success", f"Skip set: {label} → layers {describe(state.skip_for(n)) or 'none'}")
    except SkipSetError as e:
        state.flash("error", str(e))


def on_ratio() -> None:
    k = st.session_state["skipset.k"]
    apply(last_block(n, k / n), f"last {k} layers")


def on_pills() -> None:
    apply(st.session_state["skipset.pills"] or (), "hand-picked")


def adaptive(k: int) -> tuple[int, ...]:
    return suggest_skip(calib, n_skip=k)["adaptive"].layers


skip = state.skip_for(n)
tail = skip == last_block(n, len(skip) / n) if skip else True
st.session_state["skipset.k"] = len(skip)  # the widgets mirror the shared set
st.session_state["skipset.pills"] = list(skip)

st.select_slider("Skip ratio (the deepest layers, as in the paper)", options=list(range(n)),
                 format_func=lambda k: f"{k / n:.0%} · {k} layers", key="skipset.k",
                 on_change=on_ratio, help="sets a contiguous tail; presets and clicks below refine it")
if not tail:
    st.caption("The current set is not a contiguous tail; the slider shows its size only.")

st.write("Presets")
cols = st.columns(5)
if cols[0].button("Paper: last third", key="skipset.paper", width="stretch"):
    apply(preset("paper", n), "the paper's last third")
if cols[1].button("Adaptive from scores", key="skipset.adaptive", width="stretch",
                  disabled=scores is None,
                  help="the k layers with the lowest prefill importance (calibrate first)"):
    try:
        apply(adaptive(max(len(skip), 1)), "adaptive (lowest prefill importance)")
    except ValueError as e:
        state.flash("error", f"Adaptive selection failed: {e}")
for col, name in zip(cols[2:], ("shallow", "interleaved", "none")):
    if col.button(name.capitalize(), key=f"skipset.{name}", width="stretch"):
        apply(preset(name, n), name)
state.show_flash()
skip = state.skip_for(n)

st.subheader("Layers")
event = st.plotly_chart(charts.layer_strip(n, skip, scores), key="skipset.strip",
                        on_select="rerun", selection_mode=("points", "box"))
picked = sorted({int(p["x"]) for p in (event.selection.points if event else [])})
if picked and picked != st.session_state.get("skipset.last_pick"):
    st.session_state["skipset.last_pick"] = picked
    chosen = sorted(set(skip) ^ set(picked)) if len(picked) == 1 else picked
    apply(chosen, "chosen on the strip")
    st.rerun()
st.caption("Drag a box over the strip to choose a range (a box around one square toggles it); "
           "toggle single layers with the buttons below. "
           + ("Colour = prefill importance from the last calibration (log scale)."
              if scores is not None else "Calibrate first to colour the strip by importance."))
st.pills("Toggle layers", options=list(range(n)), selection_mode="multi", key="skipset.pills",
         on_change=on_pills)

st.subheader("What it buys")
c = st.columns(4)
c[0].metric("Layers skipped", f"{len(skip)} / {n}", describe(skip), delta_color="off")
for col, length in zip(c[1:3], (128, 2048)):
    col.metric(f"Ideal prefill speedup @ {length} tok", f"{ideal_speedup(shape, length, skip):.2f}×")
c[3].metric("Prefill FLOPs still spent @ 512 tok", f"{prefill_flop_share(shape, 512, skip):.1%}")
st.caption("Ideal = full prefill FLOPs / POP prefill FLOPs (matmuls only; the boundary token x_N "
           "runs all layers). Measured speedups on the Generate and Sweeps pages reach 75-95% of "
           "it in the paper.")

repair_panel.skip_set_panel(lm, skip)  # beyond the paper: fit and list K/V repairs
