"""The dashboard on the embedded Gemma-3-270M, chosen in the sidebar beside SmolLM2: its model
card, a calibration, the adaptive skip set from its scores, and Generate on a raw prompt."""
import json
import re

from apptest_util import app, charts, goto, temp_store, texts, wait_jobs  # noqa: F401 (fixture)

LABEL = "Embedded (Gemma-3-270M, offline)"


def gemma_app():
    at = app()
    at.radio(key="w.model_source").set_value(LABEL).run()  # an embedded model acts at once
    assert not at.exception and not at.sidebar.error, texts(at.sidebar.error)
    assert at.session_state["lab.model"].name == "gemma3-270m"
    return at


def test_gemma_is_offered_with_its_card_and_its_own_skip_set():
    at = gemma_app()
    assert "Embedded (SmolLM2-135M, offline)" in at.radio(key="w.model_source").options
    assert "gemma3-270m" in texts(at.sidebar.caption) and "18 layers" in texts(at.sidebar.caption)
    assert "Skip set:** 12-17" in texts(at.sidebar.markdown)  # the last third of 18 layers
    card = {r["field"]: r["value"] for r in at.dataframe[0].value.to_dict("records")}
    assert card["architecture"] == "Gemma3ForCausalLM" and "Gemma Terms" in card["licence"]
    assert "de-quantised" in card["weights"] and "Q4_K_M" in card["weights"]


def test_calibrate_then_adaptive_skip_set_then_generate_on_gemma():
    at = goto(gemma_app(), "calibrate")
    at.number_input(key="cal.n").set_value(2)
    at.number_input(key="cal.len").set_value(6)
    wait_jobs(at.button(key="cal.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.calibration"]
    assert res.model == "gemma3-270m" and len(res.prefill) == len(res.decode) == 18
    assert len(charts(at)) == 1, "the importance chart"
    goto(at, "skip_set")
    at.button(key="skipset.adaptive").click().run()
    skip = at.session_state["lab.skip"]
    lowest = sorted(range(18), key=lambda i: (res.prefill[i], -i))[:6]  # as many as before
    assert skip == tuple(sorted(lowest)), (skip, res.prefill)
    goto(at, "generate")
    raw = at.checkbox(key="gen.raw.fixed")
    assert raw.value and raw.disabled, "no chat template: the prompt goes in as written"
    at.text_area(key="gen.prompt").set_value("The capital of France is")
    at.number_input(key="gen.max_new").set_value(6)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    gen = at.session_state["lab.generation"]
    assert 1 <= len(gen["full"]["token_ids"]) <= 6 and gen["other"]["token_ids"]
    counts = gen["other"]["counts"]
    for i in range(18):
        assert counts["prefill"]["attention"][i] == (0 if i in skip else 1), i
        assert counts["prefill"]["k_proj"][i] == 1, i
    assert re.fullmatch(r"\d+\.\d\d× / \d+\.\d\d×", {m.label: m.value for m in at.metric}[
        "Ideal: FLOPs / roofline"])
    # the session report covers both results of the Gemma session
    from dashboard.session import report

    keys = ("lab.calibration", "lab.generation")
    page = report.build({"model": "gemma3-270m", "skip": skip, "models": {"gemma3-270m": {
        k: (at.session_state[k], {"model": "gemma3-270m"}) for k in keys}}})
    assert "model gemma3-270m" in page and re.search(r"<h2>Calibration: [^<]*, 2 samples</h2>", page)
    assert "<h2>Generation: full model vs" in page and page.count("plotly.js") >= 1


def test_the_same_chart_for_both_embedded_models_in_one_click(embedded, gemma):
    """Calibrations and ratio sweeps of both models in the store (as the CLI leaves them): one
    click draws both models' importance on a relative depth axis, one overlays the other model's
    sweep on the shown one."""
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.experiments import sweep as sw
    from pop_analysis.importance.calibrate import CalibrationConfig, cached_calibration

    prompts = load_prompts("builtin", limit=2)
    cfg = sw.SweepConfig(dataset="builtin", n_samples=1, ratios=(0.0, 0.33), max_new_tokens=2,
                         repeats=1, bench_tokens=16)
    for lm in (embedded, gemma):
        cached_calibration(lm, prompts, CalibrationConfig(n_samples=2, max_new_tokens=4))
        stored, _ = sw.cached_sweep(lm, "ratio", cfg)
    at = goto(app(), "calibrate")
    at.button(key="cal.models").click().run()
    assert not at.exception and "No stored calibration of" not in texts(at.info), texts(at.info)
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    traces = next(f["data"] for f in specs  # the example calibration is drawn below it
                  if "relative depth" in json.dumps(f["layout"].get("title", "")))
    by_model = {t["name"]: t["x"] for t in traces if t.get("name", "").endswith("· decode")}
    assert sorted(len(x) for x in by_model.values()) == [18, 30], by_model.keys()
    assert all(x[0] == 0 and x[-1] == 1 for x in by_model.values()), "relative depth 0..1"
    goto(at, "sweeps")
    at.selectbox(key="sw.stored").set_value(newest_key(at, "gemma3-270m")).run()
    at.button(key="sw.load").click().run()
    assert at.session_state["lab.sweep"].model == "gemma3-270m"
    at.button(key="sw.models").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["sw.overlay"] == [newest_key(at, "smollm2-135m")]
    assert "Overlaid: 1 stored sweep(s)" in texts(at.caption)


def newest_key(at, model: str) -> str:
    from pop_analysis.store import results as store

    return next(e["key"] for e in store.entries("sweep") if e["params"]["model"] == model)
