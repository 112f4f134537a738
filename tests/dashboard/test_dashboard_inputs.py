"""The dashboard's network defaults and its path rule on the page: loopback only, no error details, links and the model box refused in the same words, a bad stored calibration warns and keeps the page."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from pop_analysis.data.allowed_paths import (
    PathNotAllowed,
)

from apptest_util import APP, temp_store, texts  # noqa: F401 (fixture)
from tiny import tiny_model

ROOT = Path(__file__).resolve().parents[2]





def test_streamlit_reads_localhost_and_no_error_details_from_the_config():
    code = ("from streamlit import config; config.get_config_options(force_reparse=True); "
            "print(config.get_option('server.address')); "
            "print(config.get_option('client.showErrorDetails'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items()
                                           if not k.startswith("STREAMLIT_")})
    assert out.stdout.split() == ["localhost", "none"], out.stderr[-2000:]


def listening_addresses(port: int) -> set[str]:
    """Local addresses of sockets listening on `port`, from /proc/net/tcp{,6} (hex, LISTEN=0A)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.add(addr)
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1 as /proc shows


def test_the_server_listens_on_loopback_only(allowed_cache):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.port",
                             str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "POP_LAB_CACHE": str(allowed_cache)})
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, "streamlit exited"
                time.sleep(0.5)
        addresses = listening_addresses(port)
        assert addresses and addresses <= LOOPBACK, addresses
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def app() -> AppTest:
    from dashboard.session.cached import stored_entries, stored_payload

    stored_entries.clear()  # listings and payloads memoised for another test's store
    stored_payload.clear()
    return AppTest.from_file(APP, default_timeout=300).run()


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_loading_a_bad_stored_calibration_warns_and_keeps_the_page(embedded, allowed_cache):
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.importance.calibrate import (
        CalibrationConfig,
        cached_calibration,
        list_calibrations,
    )
    from pop_analysis.store.results import results_dir

    cached_calibration(embedded, load_prompts("builtin", limit=1),
                       CalibrationConfig(n_samples=1, max_new_tokens=2, batch_size=1))
    key = list_calibrations()[0]["key"]
    path = results_dir("calibration") / f"{key}.json"
    entry = json.loads(path.read_text())
    entry["payload"]["prefill"] = [1.0, 2.0, 3.0, 4.0, 5.0]
    path.write_text(json.dumps(entry))
    at = goto(app(), "calibrate")
    at.button(key="cal.load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "prefill has 5 entries, expected 30" in texts(at.error)
    assert len(at.error) == 1 and not at.warning, "the reason once, not a warning and an error"
    at.run()  # and on the next rerun
    assert not at.exception


def test_local_path_outside_the_allowed_folders_is_refused_on_the_page(embedded, allowed_cache, outside_folder):
    at = goto(app(), "calibrate")
    at.radio(key="cal.kind").set_value("local path").run()
    at.text_input(key="cal.path").set_value(str(outside_folder / "secrets.json")).run()
    assert not at.exception
    shown = texts(at.selectbox) + " ".join(str(s.options) for s in at.selectbox)
    assert "aws_secret_access_key" not in shown  # no field list from a file outside
    at.button(key="cal.go").click().run()
    assert not at.exception
    assert "not a file the dashboard may read" in texts(at.error)


REFUSED = "is not a file the dashboard may read"


@pytest.fixture(scope="module")
def outside_model(tmp_path_factory):
    """A loadable model folder outside every allowed folder, and a path beside it that is not."""
    d = tmp_path_factory.mktemp("elsewhere")
    tiny_model("llama").model.save_pretrained(d / "model")
    return d / "model", d / "nothing"


def linked(model: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = model
    return at.run()


def loads_of(name: str) -> list:
    from dashboard.session.resources import load_log

    return [entry for entry in load_log() if entry[0] == name]


def errors(at: AppTest) -> str:
    return texts(list(at.sidebar.error) + list(at.error) + list(at.warning))


def test_a_link_cannot_load_a_model_from_outside_the_allowed_folders(outside_model):
    model, _ = outside_model
    at = linked(str(model))
    assert not at.exception, [e.value for e in at.exception]
    assert loads_of(str(model)) == [], "the link loaded a model from outside the allowed folders"
    assert REFUSED in errors(at), errors(at)
    assert at.session_state["lab.model"].name == "smollm2-135m", "the default model is kept"


def test_a_links_refusal_reads_the_same_for_a_missing_and_an_existing_path(outside_model):
    model, nothing = outside_model
    shown = [errors(linked(str(p))).replace(str(p), "PATH") for p in (model, nothing)]
    assert REFUSED in shown[0] and shown[0] == shown[1], shown


def test_the_model_box_refuses_with_the_links_words(outside_model):
    model, _ = outside_model
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.radio(key="w.model_source").set_value("Local directory").run()  # the name box appears
    at.text_input(key="w.model_name").set_value(str(model))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert loads_of(str(model)) == []
    box, link = errors(at), errors(linked(str(model)))
    reason = box[box.index(repr(str(model))):].splitlines()[0]  # from the path on: the rule's words
    assert REFUSED in reason and reason in link, (box, link)


def test_check_model_passes_the_registry_hub_ids_and_allowed_folders(outside_model, temp_store):  # noqa: F811
    from pop_analysis.data.allowed_paths import check_model

    model, nothing = outside_model
    assert check_model("smollm2-135m") == "smollm2-135m"
    assert check_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub id names no local file
    inside = temp_store / "my-model"  # a model folder in the cache
    inside.mkdir(exist_ok=True)
    assert check_model(str(inside)) == str(inside)
    for bad in (str(model), str(nothing), "/etc", "../../etc", "~/.ssh"):
        with pytest.raises(PathNotAllowed, match=REFUSED):
            check_model(bad)


def number_boxes():
    """A page's number boxes as the dashboard draws them: keys through state.kept."""
    import streamlit as st

    from dashboard.session import state

    c = st.columns(2)
    n = c[0].number_input("Samples", 1, 1000, key=state.kept("t.n", 8))
    t = c[1].slider("Temperature", 0.05, 2.0, key=state.kept("t.temp", 0.7))
    st.write(f"samples {int(n)}, temperature {t:.2f}")


@pytest.mark.parametrize("key, bad", [("t.n", float("nan")), ("t.n", float("inf")),
                                      ("t.temp", float("nan")), ("t.temp", -float("inf")),
                                      ("t.n", "12")])
def test_a_number_box_holding_no_finite_number_is_reset_with_one_line(key, bad):
    """A value that reached a box's state (another page's copy, a session restored) but is no
    finite number: one error line under the boxes, the default back, the page keeps working."""
    at = AppTest.from_function(number_boxes)
    at.session_state[key] = bad
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [f"{bad!r} is not a finite number: reset to "
                                           f"{8 if key == 't.n' else 0.7}."]
    assert texts(at.markdown) == "samples 8, temperature 0.70"
    at.number_input[0].set_value(12).run()  # and the page goes on
    assert not at.error and texts(at.markdown) == "samples 12, temperature 0.70"
