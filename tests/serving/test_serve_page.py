"""The Serve page through AppTest: the install offer when the serving venv is missing, then one
real POP engine (switched to full and back at run time) started with progress, a generation through it, a
bounded load test drawn as charts with the protocol's fields, and Stop leaving no process."""
import math

import pytest

from pop_analysis.serving import venv
from pop_analysis.serving.server import group_members
from pop_analysis.serving.venv import ServingError

from apptest_util import app, charts, goto, notes, temp_store, texts, wait_jobs  # noqa: F401


def buttons(at) -> dict:
    return {b.key: b for b in at.button if b.key}


def test_missing_venv_offers_install(monkeypatch, tmp_path):
    monkeypatch.setenv("POP_LAB_VLLM_VENV", str(tmp_path / "nowhere"))
    at = goto(app(), "serve")
    assert "missing" in texts(at.warning) and venv.INSTALL_SCRIPT in texts(at.warning)
    install = buttons(at)["serve.install"]
    assert "600 MB" in install.label
    assert "serve.start" not in buttons(at)


def test_an_older_plugin_offers_the_update(monkeypatch, tmp_path):
    """A serving venv whose POP plugin predates pop_vllm/ here (a pull without test.sh) is not
    used: an engine would run the old plugin. The page says so and offers the quick update."""
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").write_text("#!/bin/sh\n")
    (fake / "bin" / "python").chmod(0o755)
    (fake / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (fake / ".deps.sha").write_text("x\n")
    (fake / ".plugin.sha").write_text("an older plugin\n")
    monkeypatch.setenv("POP_LAB_VLLM_VENV", str(fake))
    at = goto(app(), "serve")
    assert "older than pop_vllm/" in texts(at.warning)
    assert buttons(at)["serve.install"].label == "Update the POP plugin (seconds)"
    assert "serve.start" not in buttons(at)


def test_start_generate_load_test_stop():
    try:
        venv.python()
    except ServingError as e:
        pytest.fail(f"{e} (the Serve page test needs it: bash {venv.INSTALL_SCRIPT})")
    at = goto(app(), "serve")
    buttons(at)["serve.start"].click().run()
    wait_jobs(at, timeout=300)
    assert "Engines ready" in notes(at), notes(at)
    serving = at.session_state["lab.serving"]
    pgids = [e.proc.pid for e in serving.engines.values()]
    assert all(group_members(p) for p in pgids)
    assert any("vllm.entrypoints.openai.api_server" in c.value for c in at.code)
    assert serving.spec.eager and "eager) at" in texts(at.markdown)  # the default mode, shown
    at.toggle(key="serve.compiled").set_value(True).run()  # another mode: stale until restarted
    assert "Stale" in texts(at.warning) and "eager); press" in texts(at.warning)
    at.toggle(key="serve.compiled").set_value(False).run()
    assert "Stale" not in texts(at.warning)

    at.number_input(key="serve.max_tokens").set_value(8)
    buttons(at)["serve.generate"].click().run()
    assert "TTFT" in texts(at.markdown) and len(at.text) == 2
    assert all(t.value.strip() for t in at.text)  # full and POP both answered

    at.number_input(key="serve.requests").set_value(2)
    at.number_input(key="serve.input_len").set_value(32)
    at.number_input(key="serve.output_len").set_value(4)
    at.multiselect(key="serve.rates").set_value([math.inf]).run()
    buttons(at)["serve.bench"].click().run()
    wait_jobs(at, timeout=300)
    assert "Load test" in notes(at) and "measured" in notes(at), notes(at)
    rows = at.session_state["lab.serve_bench"]
    assert rows[0]["timing_rounds"] >= 3 and "timing_trustworthy" in rows[0]
    assert len(charts(at)) == 4
    table = at.dataframe[0].value
    assert {"TTFT speedup", "IQR", "rounds", "flag"} <= set(table.columns)

    buttons(at)["serve.stop"].click().run()
    assert "lab.serving" not in at.session_state
    assert not any(group_members(p) for p in pgids)
    assert "Start the engines" in texts(at.info)
