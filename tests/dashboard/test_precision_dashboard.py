"""Prompt precision in the dashboard (AppTest, embedded model): the int8 set beside the skip set in
the sidebar, on the Skip set page and in the link; refusals where they were typed; the measured
frontier chart."""
import json

from streamlit.testing.v1 import AppTest

from apptest_util import APP, app, charts, goto, temp_store, texts  # noqa: F401 (fixture)


def test_int8_layers_are_one_shared_setting_with_a_link_and_one_line_refusals():
    at = goto(app(), "skip_set")
    assert at.session_state["lab.skip"] == tuple(range(20, 30))
    at.button(key="precision.all").click().run()  # every kept layer
    assert at.session_state["lab.int8"] == tuple(range(20))
    assert at.text_input(key="w.int8").value == "0-19"
    assert at.query_params["int8"] == "0-19"
    assert "`IIIIIIIIIIIIIIIIIIIISSSSSSSSSS`" in texts(at.markdown)
    at.text_input(key="w.int8").set_value("5,25").run()  # 25 is skipped: refused, unchanged
    assert "both skipped and int8" in texts(at.sidebar.error)
    assert at.session_state["lab.int8"] == tuple(range(20))
    at.text_input(key="w.int8").set_value("0-4").run()
    assert list(at.pills(key="precision.pills").value) == [0, 1, 2, 3, 4]
    at.text_input(key="w.skip").set_value("3-5").run()  # the skip set takes layers 3 and 4
    assert at.text_input(key="w.int8").value == "0-2"
    link = {k: at.query_params[k] for k in at.query_params}
    assert link == {"model": "smollm2-135m", "skip": "3-5", "int8": "0-2"}
    again = AppTest.from_file(APP, default_timeout=300)
    for k, v in link.items():
        again.query_params[k] = v
    again.run()
    assert not again.exception and again.session_state["lab.int8"] == (0, 1, 2)


def test_the_frontier_is_measured_and_drawn(monkeypatch):
    from dashboard.panels import precision_controls

    # the real measurement on fewer quality prompts: int8 layers are slow on this CPU
    monkeypatch.setattr(precision_controls, "PROMPTS", 2)
    at = goto(app(), "skip_set")
    at.text_input(key="w.int8").set_value("0-9").run()
    at.button(key="precision.measure").click().run(timeout=900)
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    fig = next(f for f in specs if "TTFT speedup against quality" in f["layout"]["title"]["text"])
    names = {t["text"][0] for t in fig["data"] if t.get("mode") == "markers+text"}
    assert names == {"full", "pop", "int8 prefill", "uniform int8", "pop + int8 prefill", "current"}
    assert "MiB beside the" in texts(at.caption)
