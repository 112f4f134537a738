"""The dashboard driven in-process with streamlit's AppTest, on the embedded model, small settings.

Results go to a temporary results store (the converted embedded model is linked in, not copied),
so the tests neither read nor pollute the repository's cache/results.
"""
import os
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from apptest_util import wait_jobs
from dashboard.streaming import agreement

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "app.py")
PAGES = ("overview", "calibrate", "skip_set", "generate", "drift", "sweeps")


@pytest.fixture(scope="module", autouse=True)
def temp_store(tmp_path_factory, embedded):
    """POP_LAB_CACHE -> a temp dir whose models/ points at the converted models."""
    from pop_analysis.paths import cache_dir

    models = cache_dir() / "models"  # converted by the `embedded` fixture
    tmp = tmp_path_factory.mktemp("poplab_cache")
    (tmp / "models").symlink_to(models, target_is_directory=True)
    old = os.environ.get("POP_LAB_CACHE")
    os.environ["POP_LAB_CACHE"] = str(tmp)
    yield tmp
    if old is None:
        os.environ.pop("POP_LAB_CACHE", None)
    else:
        os.environ["POP_LAB_CACHE"] = old


def app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=300).run()


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list:
    return at.get("plotly_chart")


def notes(at: AppTest) -> str:
    return texts(list(at.success) + list(at.warning) + list(at.error) + list(at.info))


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_every_page_renders_and_the_model_loads_once():
    from dashboard.resources import load_log

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
    label = "Prefill speedup" if speed.timing.trustworthy else "Prefill speedup (flagged)"
    assert metrics[label] == (shown if speed.timing.trustworthy else f"⚠ {shown}")
    assert re.fullmatch(r"IQR \d+\.\d\d–\d+\.\d\d× · \d+ rounds", deltas[label])
    assert f"{speed.timing.rounds} rounds" in deltas[label] and speed.timing.rounds >= 3
    assert speed.timing.trustworthy or speed.timing.note in texts(at.warning)
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
    first = agreement(gen["full"]["token_ids"], gen["other"]["token_ids"])[1]
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


def test_empty_prompt_is_an_error_not_a_crash():
    at = goto(app(), "generate")
    at.button(key="gen.go").click().run()
    assert not at.exception
    assert "the prompt is empty" in texts(at.error)


def test_drift_page_draws_the_curves():
    at = goto(app(), "drift")
    at.selectbox(key="drift.example").set_value("short: arithmetic").run()
    at.number_input(key="drift.steps").set_value(2)
    wait_jobs(at.button(key="drift.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.drift"]
    assert res.skip_layers == list(range(20, 30)) and len(res.kl) == 2
    assert len(charts(at)) == 3, "cosine curves, heatmap, decode steps"
    at.multiselect(key="drift.lengths").set_value([16, 32])
    wait_jobs(at.button(key="drift.len_go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    assert [r["length"] for r in at.session_state["lab.drift_by_length"]] == [16, 32]
    assert len(charts(at)) == 4
    # Pin the run as B, measure another skip set as A: both side by side.
    at.button(key="drift.pin").click().run()
    at.text_input(key="w.skip").set_value("25-29").run()
    assert "Stale: the skip set changed" in texts(at.warning)
    wait_jobs(at.button(key="drift.go").click().run())
    assert at.session_state["lab.drift"].skip_layers == [25, 26, 27, 28, 29]
    assert at.session_state["lab.drift_b"].skip_layers == list(range(20, 30))
    assert len(charts(at)) == 6, "A's three charts, A and B side by side, drift vs length"
    assert at.dataframe, "the block-mean table of A and B"


def test_sweeps_page_loads_a_stored_sweep_beside_the_paper(embedded):
    """A tiny ratio sweep filled into the store (as the CLI would), then loaded on the page."""
    from pop_analysis import sweep as sw

    cfg = sw.SweepConfig(dataset="builtin", n_samples=1, ratios=(0.0, 0.33), max_new_tokens=2,
                         repeats=1, bench_tokens=16)
    stored, _ = sw.cached_sweep(embedded, "ratio", cfg)
    at = goto(app(), "sweeps")
    assert "Sweeps are not available" not in texts(at.warning)
    assert "No sweep shown yet" in texts(at.info)
    assert len(at.dataframe) == 4, "the paper's four tables"
    at.button(key="sw.load").click().run()
    assert not at.exception and not at.error, texts(at.error)
    assert len(charts(at)) == 1, "speed vs quality chart"
    shown = at.session_state["lab.sweep"]
    assert shown.kind == "ratio" and [r["skip_ratio"] for r in shown.rows] == \
        [r["skip_ratio"] for r in stored.rows]


def test_unknown_model_keeps_the_previous_one():
    from dashboard.resources import load_log

    at = app()
    loads = len(load_log())
    at.radio(key="w.model_source").set_value("Local directory")
    at.text_input(key="w.model_name").set_value("/nonexistent/model_dir")
    at.sidebar.button[0].click().run()  # the form's submit button
    assert not at.exception
    assert "Model not loaded" in texts(at.sidebar.error)
    assert at.session_state["lab.model"].name == "smollm2-135m"
    assert charts(at), "the page still renders on the previous model"
    assert len(load_log()) == loads


def test_unload_then_load_again():
    from dashboard.resources import load_log

    at = app()
    loads = len(load_log())
    at.button(key="w.unload").click().run()
    assert not at.exception
    assert "No model is loaded" in texts(at.info)
    at.sidebar.button[0].click().run()  # Load model (embedded)
    assert not at.exception
    assert charts(at) and len(load_log()) == loads + 1


# ---------- one skip set, many widgets ----------

def shown_everywhere(at: AppTest, want: tuple[int, ...]) -> None:
    """Every skip-set widget and label on the Skip set page reads `want`."""
    from pop_analysis.skipset import describe

    assert at.session_state["lab.skip"] == want
    assert at.select_slider(key="skipset.k").value == len(want), "slider"
    assert list(at.pills(key="skipset.pills").value) == list(want), "layer buttons"
    assert at.text_input(key="w.skip").value == describe(want).replace(" ", ""), "sidebar box"
    assert f"Skip set:** {describe(want)} ({len(want)}/30" in texts(at.sidebar.markdown), "badge"
    assert next(m for m in at.metric if m.label == "Layers skipped").value == f"{len(want)} / 30"
    assert at.query_params["skip"] == describe(want).replace(" ", ""), "the link"


def test_each_skip_set_widget_writes_the_one_shared_set():
    at = goto(app(), "skip_set")
    at.button(key="skipset.shallow").click().run()  # a preset
    shown_everywhere(at, tuple(range(10)))
    at.pills(key="skipset.pills").set_value(list(range(10)) + [15]).run()  # a layer button
    shown_everywhere(at, tuple(range(10)) + (15,))
    at.select_slider(key="skipset.k").set_value(4).run()  # the ratio slider
    shown_everywhere(at, (26, 27, 28, 29))
    at.text_input(key="w.skip").set_value("3,5-6").run()  # the sidebar box
    shown_everywhere(at, (3, 5, 6))
    at.text_input(key="w.skip").set_value("3,99").run()  # impossible: nothing changes
    assert "Skip set unchanged" in texts(at.sidebar.error)
    shown_everywhere(at, (3, 5, 6))
    at.button(key="skipset.none").click().run()
    shown_everywhere(at, ())
    # A page drawn later shows the same set.
    goto(at, "drift")
    assert "layers none (0/30)" in texts(at.caption)


def test_inputs_survive_page_changes():
    at = goto(app(), "drift")
    at.text_area(key="drift.prompt").set_value("Kept across pages?").run()
    at.number_input(key="drift.steps").set_value(3).run()
    at.multiselect(key="drift.lengths").set_value([64]).run()
    goto(at, "calibrate")
    at.radio(key="cal.kind").set_value("local path").run()
    at.text_input(key="cal.path").set_value("/tmp/prompts.jsonl").run()
    at.number_input(key="cal.n").set_value(5).run()
    goto(at, "sweeps")
    at.number_input(key="sw.n").set_value(7).run()
    at.text_input(key="sw.data").set_value("wizardlm").run()
    goto(at, "overview")
    goto(at, "drift")
    assert at.text_area(key="drift.prompt").value == "Kept across pages?"
    assert at.number_input(key="drift.steps").value == 3
    assert at.multiselect(key="drift.lengths").value == [64]
    goto(at, "calibrate")
    assert at.radio(key="cal.kind").value == "local path"
    assert at.text_input(key="cal.path").value == "/tmp/prompts.jsonl"
    assert at.number_input(key="cal.n").value == 5
    goto(at, "sweeps")
    assert at.number_input(key="sw.n").value == 7 and at.text_input(key="sw.data").value == "wizardlm"


def test_a_link_reopens_the_same_model_and_skip_set():
    at = goto(app(), "skip_set")
    at.text_input(key="w.skip").set_value("4,7-9").run()
    link = {k: at.query_params[k] for k in at.query_params}
    assert link == {"model": "smollm2-135m", "skip": "4,7-9"}
    again = AppTest.from_file(APP, default_timeout=300)
    for k, v in link.items():
        again.query_params[k] = v
    again.run()
    assert not again.exception
    assert again.session_state["lab.skip"] == (4, 7, 8, 9)
    assert "Skip set:** 4, 7-9 (4/30" in texts(again.sidebar.markdown)
    bad = AppTest.from_file(APP, default_timeout=300)
    bad.query_params["skip"] = "28-40"
    bad.run()
    assert not bad.exception and bad.session_state["lab.skip"] == tuple(range(20, 30))


def test_cancel_keeps_the_lengths_that_finished():
    at = goto(app(), "drift")
    at.number_input(key="drift.steps").set_value(2)
    at.multiselect(key="drift.lengths").set_value([16, 512, 1024, 2048]).run()
    at.button(key="drift.len_go").click().run()
    job = at.session_state["lab.jobs"]["drift_length"]
    assert at.button(key="cancel.drift_length"), "a Cancel button beside the live bar"
    end = time.time() + 300
    while job.monitor.snapshot()[0] is None or job.monitor.snapshot()[0].done < 4:
        assert time.time() < end and job.running, "the first length never finished"
        time.sleep(0.1)  # 16 tokens: 2 runs x 2 steps
    at.button(key="cancel.drift_length").click().run()
    wait_jobs(at)
    rows = at.session_state["lab.drift_by_length"]
    assert [r["length"] for r in rows][0] == 16 and len(rows) < 4
    assert "cancelled" in notes(at)
    assert "Partial result: cancelled; lengths" in texts(at.warning)
    assert len(charts(at)) == 1, "the partial curve is drawn"


def test_static_mode_names_its_variant():
    at = goto(app(), "generate")
    at.selectbox(key="gen.example").set_value("short: sky").run()
    at.selectbox(key="gen.variant").set_value("static").run()
    at.number_input(key="gen.max_new").set_value(2)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    labels = {m.label for m in at.metric}
    assert "TTFT static (median)" in labels and not any("POP" in x for x in labels), labels
    assert "Decode tok/s (full / static)" in labels


def test_every_page_offers_downloads_and_the_report_covers_the_session():
    from dashboard import report

    at = goto(app(), "drift")
    at.number_input(key="drift.steps").set_value(2)
    at.selectbox(key="drift.example").set_value("short: arithmetic").run()
    wait_jobs(at.button(key="drift.go").click().run())
    for page in ("overview", "skip_set", "drift"):  # the others once they hold a result
        goto(at, page)
        labels = [b.proto.label for b in at.get("download_button")]
        assert "Data (JSON)" in labels and any(x.startswith("Figure:") for x in labels), page
    assert any(b.proto.label.startswith("Report of this session") for b in at.get("download_button"))
    snap = {"model": "smollm2-135m", "skip": at.session_state["lab.skip"],
            "results": {"lab.drift": at.session_state["lab.drift"]},
            "context": {"lab.drift": {"prompt": "x"}}}
    page = report.build(snap)
    assert page.startswith("<!doctype html>") and "Drift: " in page and "Made from: prompt: x" in page
    assert page.count("plotly.js") >= 1 and page.count("<script") >= 2, "plotly inlined once"


def test_a_background_run_says_why_a_stored_entry_was_not_used():
    """The store's notices reach the page from the worker thread, under the run's outcome."""
    import json

    from pop_analysis.store import results_dir

    at = goto(app(), "drift")
    at.number_input(key="drift.steps").set_value(2)
    at.selectbox(key="drift.example").set_value("short: sky").run()
    wait_jobs(at.button(key="drift.go").click().run())
    paths = list(results_dir("drift").glob("*.json"))
    assert paths, "the run was stored"
    for path in paths:  # a stored entry that no longer passes its check
        entry = json.loads(path.read_text())
        entry["payload"]["hidden_cos"] = [1.0, 2.0]
        path.write_text(json.dumps(entry))
    wait_jobs(at.button(key="drift.go").click().run())
    assert "not used" in texts(at.warning), texts(at.warning)
    assert "Drift: measured in" in notes(at), "computed again after the notice"
