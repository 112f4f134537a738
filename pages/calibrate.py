"""Calibrate: stage-aware layer importance (prefill vs decode) from virtual gates."""
import streamlit as st

from dashboard.charts import calibrate as calibrate_charts
from dashboard.charts.overlays import importance_by_depth
from dashboard.panels import exports, model_compare, presenter, widgets
from dashboard.session import cached, classmode, jobs, state
from pop_analysis.data.prompts import DatasetError
from pop_analysis.errors import first_line
from pop_analysis.importance import calibrate as cal
from pop_analysis.progress import duration
from pop_analysis.quality.stats import mean_halfwidths

st.title("Calibrate: which layers matter for prefill vs decode")
st.markdown("One virtual gate per layer and stage; importance = E[(dL/dg)²] over responses the "
            "model samples itself (one forward + one backward per sample).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers


with st.container(border=True):
    picked = widgets.dataset_picker("cal")
    c = st.columns(5)
    n_samples = widgets.number(c[0], "Samples", 1, 1000, key=state.kept("cal.n", 8))
    max_new = widgets.number(c[1], "Response tokens", 1, 1024, key=state.kept("cal.len", 32))
    seed = widgets.number(c[2], "Seed", 0, 2**31 - 1, key=state.kept("cal.seed", 0))
    loo = widgets.number(c[3], "Exact LOO samples", 0, 64, key=state.kept("cal.loo", 0),
                            help="leave-one-layer-out on this many samples: the Taylor-vs-exact check")
    use_cache = c[4].checkbox("Use stored result", key=state.kept("cal.cache", True))
    busy = jobs.running("calibrate")
    go = st.button("Run calibration", type="primary", key="cal.go", disabled=picked is None or busy or widgets.refused())
    now = {"model": lm.name, "data": picked[2] if picked else None, "samples": int(n_samples),
           "response tokens": int(max_new), "seed": int(seed), "LOO samples": int(loo)}
    if go and picked is not None:
        source, field, label = picked
        cfg = cal.CalibrationConfig(n_samples=int(n_samples), max_new_tokens=int(max_new),
                                    seed=int(seed), loo_samples=int(loo),
                                    batch_size=min(16, int(n_samples)))
        try:
            prompts = cached.prompt_set(source, field, int(n_samples))
            jobs.start("calibrate", f"Calibrating on {label}",
                       lambda progress: cal.cached_calibration(lm, prompts, cfg, use_cache, progress,
                                                               progress.notice),
                       lambda job: jobs.outcome(
                           job, state.CALIBRATION, f"Calibration of {label}",
                           "use fewer samples, shorter responses or a smaller model.",
                           lambda p: f"{p.n_samples} of {cfg.n_samples} samples",
                           lambda r: f"{r.n_samples} samples in {duration(r.seconds)} "
                                     f"({r.samples_per_s:.2f} samples/s)"), context=now)
        except DatasetError as e:
            st.error(f"Cannot read the prompts: {e}")
        except (ValueError, OSError) as e:
            st.error(f"Calibration failed: {first_line(e)}")
    jobs.panel("calibrate")

entries = cached.stored_entries(cal.KIND)
labels = {e["key"]: cached.calibration_label(e) for e in entries}
if entries:
    with st.expander(f"Stored calibrations ({len(entries)}): compare or reload", expanded=False):
        st.multiselect("Overlay on the importance chart", list(labels), format_func=labels.get,
                       key=state.kept("cal.overlay", [], list(labels)), max_selections=8,
                       help="thin dotted (prefill) and dashed (decode) lines beside the result")
        a, b = st.columns([4, 1], vertical_alignment="bottom")
        key = a.selectbox("Show as the main result", list(labels), format_func=labels.get,
                          key="cal.stored")
        if b.button("Load", key="cal.load"):
            res = cached.load_result(cal.KIND, key, cal.CalibrationResult, "Run the calibration again.")
            if res is not None:
                state.keep_result(state.CALIBRATION, res, {"stored": labels[key]})
        st.button("Same chart for both embedded models", key="cal.models",
                  on_click=lambda: st.session_state.update({model_compare.MODELS_SHOWN: True}),
                  help="the newest stored calibration of each, on a relative depth axis")
if st.session_state.get(model_compare.MODELS_SHOWN):
    curves, missing = model_compare.calibration_curves(entries)
    if curves:
        share = st.toggle("As a share of each model's decode importance", key="cal.share", value=True)
        presenter.plot(importance_by_depth(curves, share), key="cal.models_chart")
    if missing:
        st.info(f"No stored calibration of {', '.join(missing)} yet: load it in the sidebar and run one.")

res = st.session_state.get(state.CALIBRATION)
if res is None:
    st.info("No calibration yet: run one above or load a stored one.")
    st.stop()

st.subheader(f"Importance per layer — {res.model}, {res.dataset}, {res.n_samples} samples")
widgets.made_from(state.CALIBRATION, now, "Run calibration")
classmode.offer_back("calibration", lm.name, n)
if res.n_layers != n:
    st.warning(f"This result is for a {res.n_layers}-layer model; the loaded model has {n}.")
t = st.columns(3)
log = t[0].toggle("Log scale", key=state.kept("cal.log", True))
bands = t[1].toggle("95% interval bands", key=state.kept("cal.bands", True),
                    help="the 95% interval of each layer's mean over the samples")
influence = t[2].toggle("Block influence overlay", key=state.kept("cal.influence", False),
                        help="ShortGPT's 1 − cos(layer input, output), on the right axis")
overlays = cached.calibration_overlays(state.value("cal.overlay", []), labels)
skip = state.skip_for(n) if res.n_layers == n else ()
view = calibrate_charts.ImportanceView(log=log, bands=bands, skip=tuple(skip),
                                      overlays=tuple(overlays or ()),
                                      block_influence=res.block_influence if influence else None)
fig = calibrate_charts.importance_chart(res.prefill, res.decode,
                                       mean_halfwidths(res.prefill_std, res.n_samples),
                                       mean_halfwidths(res.decode_std, res.n_samples), view)
presenter.plot(fig, key="cal.chart")
if overlays:
    st.caption(f"Overlaid: {len(overlays)} stored calibration(s), dotted = prefill, dashed = decode.")
m = st.columns(4)
m[0].metric("Wall time", duration(res.seconds))
m[1].metric("Samples / s", f"{res.samples_per_s:.2f}")
m[2].metric("Decode > prefill in", f"{sum(d > p for p, d in zip(res.prefill, res.decode))}/{res.n_layers} layers")
if res.rank_corr:
    m[3].metric("Spearman Taylor vs exact", " / ".join(
        f"{k}: {v:.2f}" if v is not None else f"{k}: –" for k, v in res.rank_corr.items()))
figures = {"importance": fig}
if res.loo:
    cols = st.columns(2)
    for col, stage in zip(cols, ("prefill", "decode")):
        # Taylor means over the same samples as the exact run, as rank_corr compares them.
        taylor = (res.loo_taylor or {}).get(stage) or getattr(res, stage)
        figures[f"taylor_vs_exact_{stage}"] = calibrate_charts.rank_scatter(taylor, res.loo[stage], stage)
        col.plotly_chart(figures[f"taylor_vs_exact_{stage}"], key=f"cal.rank.{stage}")


def use(layers) -> None:
    state.set_skip(layers, n)


st.markdown("**Suggested skip sets** (ideal prefill speedup at 512 tokens)")
for name, s in cal.suggest_skip(res).items():
    a, b = st.columns([4, 1])
    a.write(f"{name}: layers {list(s.layers)} · {s.ideal_speedup:.2f}× — {s.description}")
    b.button("Use", key=f"cal.use.{name}", disabled=res.n_layers != n, on_click=use,
             args=(s.layers,))

rows = [{"layer": i, "prefill": res.prefill[i], "decode": res.decode[i],
         "prefill_std": res.prefill_std[i], "decode_std": res.decode_std[i]}
        for i in range(res.n_layers)]
exports.offer("calibration", data=res.to_dict(), rows=rows, figures=figures)
