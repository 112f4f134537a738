"""Calibrate: stage-aware layer importance (prefill vs decode) from virtual gates."""
import datetime
import io
import json
import time

import streamlit as st
import torch

from dashboard import charts, data, state, widgets
from pop_analysis import calibrate as cal
from pop_analysis.data import DatasetError

st.title("Calibrate: which layers matter for prefill vs decode")
st.markdown("One virtual gate per layer and stage; importance = E[(dL/dg)²] over responses the "
            "model samples itself (one forward + one backward per sample).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers

with st.container(border=True):
    picked = widgets.dataset_picker("cal")
    c = st.columns(5)
    n_samples = c[0].number_input("Samples", 1, 1000, 8, key="cal.n")
    max_new = c[1].number_input("Response tokens", 1, 1024, 32, key="cal.len")
    seed = c[2].number_input("Seed", 0, 2**31 - 1, 0, key="cal.seed")
    loo = c[3].number_input("Exact LOO samples", 0, 64, 0, key="cal.loo",
                            help="leave-one-layer-out on this many samples: the Taylor-vs-exact check")
    use_cache = c[4].checkbox("Use cached result", True, key="cal.cache")
    go = st.button("Run calibration", type="primary", key="cal.go", disabled=picked is None)

if go and picked is not None:
    source, field, label = picked
    cfg = cal.CalibrationConfig(n_samples=int(n_samples), max_new_tokens=int(max_new), seed=int(seed),
                                loo_samples=int(loo), batch_size=min(16, int(n_samples)))
    try:
        prompts = data.prompt_set(source, field, int(n_samples))
        t0 = time.perf_counter()
        with widgets.run_lock(), widgets.ProgressBar("Calibrating") as bar:
            result, hit = cal.cached_calibration(lm, prompts, cfg, use_cache=use_cache, progress=bar,
                                                 notice=st.warning)
        took = time.perf_counter() - t0
        st.session_state[state.CALIBRATION] = result
        note = (f"Loaded from the cache in {took * 1e3:.0f} ms." if hit else
                f"Computed in {took:.1f} s ({result.samples_per_s:.2f} samples/s); {bar.summary}.")
        st.success(f"Calibration of {label}: {note}")
    except DatasetError as e:
        st.error(f"Cannot read the prompts: {e}")
    except torch.OutOfMemoryError:
        st.error("Out of memory: use fewer samples, shorter responses or a smaller model.")
    except (ValueError, RuntimeError, OSError) as e:
        st.error(f"Calibration failed: {e}")

entries = data.stored_entries(cal.KIND)
if entries:
    with st.expander(f"Cached calibrations ({len(entries)})"):
        def label_of(e):
            p = e["params"]
            when = datetime.datetime.fromtimestamp(e["saved_at"]).strftime("%Y-%m-%d %H:%M")
            return f"{p.get('model')} · {p.get('dataset')} · {p.get('n_samples')} samples · {when}"
        key = st.selectbox("Stored result", [e["key"] for e in entries], key="cal.stored",
                           format_func=lambda k: label_of(next(e for e in entries if e["key"] == k)))
        if st.button("Load", key="cal.load"):
            t0 = time.perf_counter()
            res = data.load_result(cal.KIND, key, cal.CalibrationResult)
            if res is None:
                st.error("That entry is missing or unreadable; run the calibration again.")
            else:
                st.session_state[state.CALIBRATION] = res
                st.success(f"Loaded in {(time.perf_counter() - t0) * 1e3:.0f} ms.")

res = st.session_state.get(state.CALIBRATION)
if res is None:
    st.info("No calibration yet: run one above or load a cached one.")
    st.stop()

st.subheader(f"Importance per layer — {res.model}, {res.dataset}, {res.n_samples} samples")
if res.n_layers != n:
    st.warning(f"This result is for a {res.n_layers}-layer model; the loaded model has {n}.")
t = st.columns(3)
log = t[0].toggle("Log scale", True, key="cal.log")
bands = t[1].toggle("Spread bands (±1 std)", True, key="cal.bands")
influence = t[2].toggle("Block influence overlay", False, key="cal.influence")
skip = state.skip_for(n) if res.n_layers == n else ()
st.plotly_chart(charts.importance_chart(res.prefill, res.decode, res.prefill_std, res.decode_std,
                                        log=log, bands=bands, skip=skip,
                                        block_influence=res.block_influence if influence else None),
                key="cal.chart")
m = st.columns(4)
m[0].metric("Wall time", f"{res.seconds:.1f} s")
m[1].metric("Samples / s", f"{res.samples_per_s:.2f}")
m[2].metric("Decode > prefill in", f"{sum(d > p for p, d in zip(res.prefill, res.decode))}/{res.n_layers} layers")
if res.rank_corr:
    m[3].metric("Spearman Taylor vs exact", " / ".join(
        f"{k}: {v:.2f}" if v is not None else f"{k}: –" for k, v in res.rank_corr.items()))
if res.loo:
    cols = st.columns(2)
    for col, stage in zip(cols, ("prefill", "decode")):
        # Taylor means over the same samples as the exact run, as rank_corr compares them.
        taylor = (res.loo_taylor or {}).get(stage) or getattr(res, stage)
        col.plotly_chart(charts.rank_scatter(taylor, res.loo[stage], stage),
                         key=f"cal.rank.{stage}")

sugg = cal.suggest_skip(res)
st.markdown("**Suggested skip sets** (ideal prefill speedup at 512 tokens)")
for name, s in sugg.items():
    a, b = st.columns([4, 1])
    a.write(f"{name}: layers {list(s.layers)} · {s.ideal_speedup:.2f}× — {s.description}")
    if b.button("Use", key=f"cal.use.{name}", disabled=res.n_layers != n):
        state.set_skip(s.layers, n)
        st.rerun()

rows = [{"layer": i, "prefill": res.prefill[i], "decode": res.decode[i], "prefill_std": res.prefill_std[i],
         "decode_std": res.decode_std[i]} for i in range(res.n_layers)]
buf = io.StringIO()
buf.write("layer,prefill,decode,prefill_std,decode_std\n")
buf.writelines(",".join(str(r[k]) for k in r) + "\n" for r in rows)
d = st.columns(2)
d[0].download_button("Download CSV", buf.getvalue(), "calibration.csv", "text/csv", key="cal.csv")
d[1].download_button("Download JSON", json.dumps(res.to_dict()), "calibration.json",
                     "application/json", key="cal.json")
