"""The dashboard's shared state in AppTest, on the embedded model: one skip set written by every
widget, inputs kept across pages, links, cancel, variant labels, downloads and the session report,
store notices from background runs. Results go to a temporary results store."""
import time

from streamlit.testing.v1 import AppTest

from apptest_util import APP, app, charts, goto, notes, temp_store, texts, wait_jobs  # noqa: F401 (fixture)

# ---------- one skip set, many widgets ----------

def shown_everywhere(at: AppTest, want: tuple[int, ...]) -> None:
    """Every skip-set widget and label on the Skip set page reads `want`."""
    from pop_analysis.engine.skipset import describe

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
    assert "drift.length_chart" in [c.key for c in charts(at)], "the partial curve is drawn"


def test_static_mode_names_its_variant():
    at = goto(app(), "generate")
    at.selectbox(key="gen.example").set_value("short: sky").run()
    at.selectbox(key="gen.variant").set_value("static").run()
    at.number_input(key="gen.max_new").set_value(2)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    labels = {m.label for m in at.metric}
    assert "TTFT static (median)" in labels and not any("POP" in x for x in labels), labels
    decode = next(m for m in at.metric if m.label.startswith("Decode tok/s"))
    assert "(full / static, one streamed run each)" in str(decode.proto.delta)


def test_every_page_offers_downloads_and_the_report_covers_the_session():
    from dashboard.session import report

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
            "models": {"smollm2-135m": {"lab.drift": (at.session_state["lab.drift"],
                                                      {"prompt": "x"}),
                                        "lab.heal_drift": (at.session_state["lab.heal_drift"],
                                                           {"example": "Stored example: y"})}}}
    page = report.build(snap)
    assert page.startswith("<!doctype html>") and "Drift: " in page and "Made from: prompt: x" in page
    assert "Drift while healing: 439 prompt tokens" in page and "Stored example: y" in page
    assert page.count("plotly.js") >= 1 and page.count("<script") >= 2, "plotly inlined once"


def test_a_background_run_says_why_a_stored_entry_was_not_used():
    """The store's notices reach the page from the worker thread, under the run's outcome."""
    import json

    from pop_analysis.store.results import results_dir

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
