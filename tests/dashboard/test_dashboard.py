"""The dashboard driven in-process with streamlit's AppTest, on the embedded model, small settings.

Results go to a temporary results store (the converted embedded model is linked in, not copied),
so the tests neither read nor pollute the repository's cache/results.
"""
import re

from pop_analysis.quality.metrics import agreement

from apptest_util import app, charts, goto, temp_store, texts, wait_jobs  # noqa: F401 (fixture)

PAGES = ("overview", "calibrate", "methods", "skip_set", "generate", "drift", "sweeps")


def test_every_page_renders_and_the_model_loads_once():
    from dashboard.session.resources import load_log

    at = app()
    assert not at.exception
    loads = len(load_log())
    assert "smollm2-135m" in texts(at.sidebar.caption)
    assert "Skip set:** 20-29" in texts(at.sidebar.markdown)  # the paper's last third of 30 layers
    assert charts(at), "the overview draws the POP diagram"
    assert at.dataframe, "the overview shows the model card"
    for page in PAGES:
        goto(at, page)
        assert "Skip set:** 20-29" in texts(at.sidebar.markdown), page
    assert len(load_log()) == loads, "switching pages reloaded the model"


def test_ratio_changes_the_skip_set_on_every_page():
    at = goto(app(), "skip_set")
    at.select_slider(key="skipset.k").set_value(6).run()
    assert not at.exception
    assert at.session_state["lab.skip"] == tuple(range(24, 30))
    assert "Layers skipped" in texts(at.metric) or any(m.label == "Layers skipped" for m in at.metric)
    assert next(m for m in at.metric if m.label == "Layers skipped").value == "6 / 30"
    for page in ("generate", "drift", "overview"):
        goto(at, page)
        assert "Skip set:** 24-29" in texts(at.sidebar.markdown), page
    goto(at, "generate")
    assert "layers 24-29 (6/30)" in texts(at.caption)
    goto(at, "drift")
    assert "layers 24-29 (6/30)" in texts(at.caption)


def test_presets_and_an_impossible_skip_set():
    at = goto(app(), "skip_set")
    at.button(key="skipset.interleaved").click().run()
    assert at.session_state["lab.skip"] == tuple(range(2, 30, 3))
    at.button(key="skipset.none").click().run()
    assert at.session_state["lab.skip"] == ()
    at.pills(key="skipset.pills").set_value(list(range(30))).run()  # every layer: impossible
    assert not at.exception
    assert "cannot skip all 30 layers" in texts(at.error)
    assert at.session_state["lab.skip"] == (), "a rejected set leaves the shared one unchanged"
    at.pills(key="skipset.pills").set_value([3, 7]).run()
    assert at.session_state["lab.skip"] == (3, 7)
    assert "Skip set:** 3, 7" in texts(at.sidebar.markdown)


def test_calibration_draws_importance_and_reloads_from_cache_fast():
    at = goto(app(), "calibrate")
    at.number_input(key="cal.n").set_value(2)
    at.number_input(key="cal.len").set_value(8)
    wait_jobs(at.button(key="cal.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    msg = texts(at.success)
    assert re.search(r"2 samples in \d+ s \([\d.]+ samples/s\); stored for next time", msg), msg
    assert len(charts(at)) == 1, "the importance chart"
    res = at.session_state["lab.calibration"]
    assert res.n_samples == 2 and len(res.prefill) == 30 and len(res.decode) == 30
    assert "Made from: model smollm2-135m · data built-in prompts · samples 2" in texts(at.caption)
    # The same request again comes from the store.
    wait_jobs(at.button(key="cal.go").click().run())
    assert "loaded from the results store" in texts(at.success)
    assert len(charts(at)) == 1
    # Changing an input marks the shown result stale.
    at.number_input(key="cal.len").set_value(9).run()
    assert "Stale: the response tokens changed" in texts(at.warning)
    # The skip-set strip is now coloured by importance and "adaptive" is enabled.
    goto(at, "skip_set")
    assert not at.button(key="skipset.adaptive").disabled
    at.button(key="skipset.adaptive").click().run()
    assert len(at.session_state["lab.skip"]) == 10


def test_bad_dataset_path_is_reported_where_the_user_acted():
    at = goto(app(), "calibrate")
    at.radio(key="cal.kind").set_value("local path").run()
    at.text_input(key="cal.path").set_value("/nonexistent/prompts.jsonl").run()
    at.button(key="cal.go").click().run()
    assert not at.exception
    assert "Cannot read the prompts" in texts(at.error)
    assert at.title[0].value.startswith("Calibrate"), "the page keeps running"


def test_generation_shows_both_outputs_speedup_and_call_counts():
    at = goto(app(), "generate")
    at.selectbox(key="gen.example").set_value("short: sky").run()
    assert at.text_area(key="gen.prompt").value.startswith("Why is the sky blue")
    at.number_input(key="gen.max_new").set_value(8)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    outputs = [m for m in at.markdown if "pop-output" in str(m.value)]
    assert len(outputs) == 2, "full and POP outputs side by side"
    metrics = {m.label: m.value for m in at.metric}
    deltas = {m.label: m.delta for m in at.metric}
    speed = at.session_state["lab.generation"]["speed"]
    shown = "%.2f×" % speed.speedup
    # The protocol's median, its spread and rounds; a flagged figure never reads plainly.
    from dashboard.panels.generate_speed import flags

    flagged = flags(speed)  # the protocol's reasons, and medians outside the rounds' IQR
    assert bool(flagged) >= (not speed.timing.trustworthy)
    label = "Prefill speedup (flagged)" if flagged else "Prefill speedup"
    assert metrics[label] == (f"⚠ {shown}" if flagged else shown)
    assert re.fullmatch(r"IQR \d+\.\d\d–\d+\.\d\d× · \d+ rounds", deltas[label])
    assert f"{speed.timing.rounds} rounds" in deltas[label] and speed.timing.rounds >= 3
    assert all(reason in texts(at.warning) for reason in flagged)
    assert metrics["TTFT full (median)"].endswith("ms") and metrics["TTFT POP (median)"].endswith("ms")
    assert re.fullmatch(r"\d+\.\d\d× / \d+\.\d\d×", metrics["Ideal: FLOPs / roofline"])
    assert re.fullmatch(r"\d+%", metrics["Token agreement"])
    gen = at.session_state["lab.generation"]
    assert len(gen["full"]["token_ids"]) <= 8 and gen["other"]["token_ids"]
    counts = gen["other"]["counts"]
    skipped, kept = 25, 3  # default skip set 20-29
    assert counts["prefill"]["attention"][skipped] == 0 and counts["prefill"]["k_proj"][skipped] == 1
    assert counts["prefill"]["attention"][kept] == 1
    assert counts["boundary"]["attention"][skipped] == 1, "x_N runs the full model"
    assert len(charts(at)) == 3, "token arrival + two call-count heatmaps"
    assert "Made from: prompt Why is the sky blue?" in texts(at.caption)
    # The logit lens: commitment strip, and top-5 candidates when the outputs diverge.
    at.button(key="gen.lens").click().run()
    assert not at.exception and not at.error, texts(at.error)
    traces = gen["lens"]
    assert traces["full"].tokens == gen["full"]["token_ids"]
    assert [c[0][0] for c in traces["full"].topk] == gen["full"]["token_ids"], "greedy = top-1"
    first = agreement(gen["full"]["token_ids"], gen["other"]["token_ids"]).first_divergence
    assert len(charts(at)) == (4 if first is None else 5)
    # The result and the inputs survive a page switch; a changed input marks it stale.
    goto(at, "overview")
    goto(at, "generate")
    assert len([m for m in at.markdown if "pop-output" in str(m.value)]) == 2
    assert at.text_area(key="gen.prompt").value.startswith("Why is the sky blue")
    assert at.number_input(key="gen.max_new").value == 8
    at.selectbox(key="gen.variant").set_value("static").run()
    assert "Stale: the variant changed" in texts(at.warning)
    assert "TTFT POP (median)" in {m.label for m in at.metric}, "the shown result is POP's"


def test_empty_skip_set_reads_about_one_and_re_measures():
    at = goto(app(), "generate")
    at.session_state["lab.skip"] = ()
    at.session_state["lab.skip_n_layers"] = 30
    at.selectbox(key="gen.example").set_value("short: sky").run()
    at.number_input(key="gen.max_new").set_value(2)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    speed = at.session_state["lab.generation"]["speed"]
    assert speed.ideal_speedup == 1.0 and speed.roofline_speedup == 1.0
    assert 0.75 <= speed.speedup <= 1.33 or not speed.timing.trustworthy, speed.timing.ratios
    at.button(key="gen.remeasure").click().run()
    assert not at.exception and not at.error, texts(at.error)
    again = at.session_state["lab.generation"]["speed"]
    assert again is not speed and again.timing.rounds >= 3


def test_generate_opens_with_a_prompt_and_an_empty_box_waits_for_one():
    from pop_analysis.data.example_prompts import SHORT

    at = goto(app(), "generate")
    assert at.text_area(key="gen.prompt").value == SHORT, "a prompt to start from"
    assert not at.button(key="gen.go").disabled
    at.text_area(key="gen.prompt").set_value("   ").run()
    assert not at.exception and not at.error, "an empty box is not an error"
    assert at.button(key="gen.go").disabled


def test_drift_page_draws_the_curves():
    at = goto(app(), "drift")
    at.selectbox(key="drift.example").set_value("short: arithmetic").run()
    at.number_input(key="drift.steps").set_value(2)
    wait_jobs(at.button(key="drift.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.drift"]
    assert res.skip_layers == list(range(20, 30)) and len(res.kl) == 2
    keys = [c.key for c in charts(at)]  # the healing section still shows its stored example
    assert keys == ["drift.curves", "drift.heat", "drift.steps_chart", "drift.heal_chart"], keys
    at.multiselect(key="drift.lengths").set_value([16, 32])
    wait_jobs(at.button(key="drift.len_go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    assert [r["length"] for r in at.session_state["lab.drift_by_length"]] == [16, 32]
    assert len(charts(at)) == 5, "the four above and drift vs length"
    # Pin the run as B, measure another skip set as A: both side by side.
    at.button(key="drift.pin").click().run()
    at.text_input(key="w.skip").set_value("25-29").run()
    assert "Stale: the skip set changed" in texts(at.warning)
    wait_jobs(at.button(key="drift.go").click().run())
    assert at.session_state["lab.drift"].skip_layers == [25, 26, 27, 28, 29]
    assert at.session_state["lab.drift_b"].skip_layers == list(range(20, 30))
    assert len(charts(at)) == 7, ("A's three charts, A and B side by side, the healing example, "
                                  "drift vs length")
    assert at.dataframe, "the block-mean table of A and B"


def test_sweeps_page_loads_a_stored_sweep_beside_the_paper(embedded):
    """A tiny ratio sweep filled into the store (as the CLI would), then loaded on the page."""
    from pop_analysis.experiments import sweep as sw

    cfg = sw.SweepConfig(dataset="builtin", n_samples=1, ratios=(0.0, 0.33), max_new_tokens=2,
                         repeats=1, bench_tokens=16)
    stored, _ = sw.cached_sweep(embedded, "ratio", cfg)
    at = goto(app(), "sweeps")
    assert "Sweeps are not available" not in texts(at.warning)
    assert "Stored example: smollm2-135m · ratio sweep" in texts(at.info), "the page opens with it"
    assert len(at.dataframe) == 4 + 2, "the paper's four tables, the example's two"
    at.button(key="sw.load").click().run()
    assert not at.exception and not at.error, texts(at.error)
    assert len(charts(at)) == 1, "speed vs quality chart"
    shown = at.session_state["lab.sweep"]
    assert shown.kind == "ratio" and [r["skip_ratio"] for r in shown.rows] == \
        [r["skip_ratio"] for r in stored.rows]


def test_unknown_model_keeps_the_previous_one():
    from dashboard.session.resources import load_log

    at = app()
    loads = len(load_log())
    at.radio(key="w.model_source").set_value("Local directory").run()  # the name box appears
    at.text_input(key="w.model_name").set_value("/nonexistent/model_dir")
    at.sidebar.button[0].click().run()  # the form's submit button
    assert not at.exception
    assert "Model not loaded" in texts(at.sidebar.error)
    assert at.session_state["lab.model"].name == "smollm2-135m"
    assert charts(at), "the page still renders on the previous model"
    assert len(load_log()) == loads


def test_unload_then_load_again():
    from dashboard.session.resources import load_log

    at = app()
    loads = len(load_log())
    at.button(key="w.unload").click().run()
    assert not at.exception
    assert "No model is loaded" in texts(at.info)
    at.button(key="w.load").click().run()  # Load model (embedded)
    assert not at.exception
    assert charts(at) and len(load_log()) == loads + 1


def test_a_model_that_fails_to_load_is_said_once(temp_store):
    from dashboard.session.state import ModelSpec

    at = app()
    missing = temp_store / "no_model_here"  # inside the allowed cache folder, but no model
    at.session_state["lab.model"] = ModelSpec(str(missing))
    goto(at, "generate")
    said = [e for e in at.sidebar.error if "Model not loaded" in str(e.value)]
    assert len(said) == 1, (texts(at.sidebar.error), texts(at.error), texts(at.info))
    assert "No model is loaded" in texts(at.info), "the page says what to do, once"
