"""The dashboard's network defaults, allowed local paths and stored-result checks (issue 13,
findings 1 and 3)."""
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

from pop_analysis.data.allowed_paths import ENV, PathNotAllowed, check_path, check_source

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "app.py")
SECRET = {"aws_access_key_id": "AKIA-not-real", "aws_secret_access_key": "not-real-either"}


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    from pop_analysis.store.paths import cache_dir

    models = cache_dir() / "models"
    store = tmp_path / "cache"
    store.mkdir()
    (store / "models").symlink_to(models.resolve(), target_is_directory=True)
    monkeypatch.setenv("POP_LAB_CACHE", str(store))
    monkeypatch.delenv(ENV, raising=False)
    return store


@pytest.fixture()
def outside(tmp_path):
    """A folder that is none of the allowed ones (the tests run from the repository)."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "secrets.json").write_text(json.dumps([SECRET]))
    (d / "secrets.csv").write_text(",".join(SECRET) + "\n" + ",".join(SECRET.values()) + "\n")
    return d


# --- network defaults ----------------------------------------------------------------------------

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


def test_the_server_listens_on_loopback_only(cache):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.port",
                             str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "POP_LAB_CACHE": str(cache)})
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


# --- allowed local paths ---------------------------------------------------------------------

def test_allowed_folders_and_refusals(cache, outside, monkeypatch):
    inside = cache / "prompts.jsonl"
    inside.write_text('{"prompt": "hi"}\n')
    assert check_path(str(inside)) == inside.resolve()
    assert check_path("README.md") == (ROOT / "README.md").resolve()  # the working directory
    shared = ROOT.parent / "shared" / "data" / "gsm8k_test.jsonl"
    assert check_path(str(shared)) == shared.resolve()
    for bad in ("/etc/passwd", str(outside / "secrets.json"), str(cache / ".." / "elsewhere"),
                ".git/config", str(cache / ".hidden.jsonl")):
        with pytest.raises(PathNotAllowed, match="not a file the dashboard may read"):
            check_path(bad)
    monkeypatch.setenv(ENV, f"/nonexistent{os.pathsep}{outside}")  # the user's own folder
    assert check_path(str(outside / "secrets.json")) == (outside / "secrets.json").resolve()


def test_refusal_reads_the_same_whether_or_not_the_file_exists(cache, outside):
    messages = []
    for name in ("secrets.json", "nothing.json"):
        with pytest.raises(PathNotAllowed) as e:
            check_path(str(outside / name))
        messages.append(str(e.value).replace(name, "X"))
    assert messages[0] == messages[1]


def test_a_symlink_to_a_system_file_is_refused(cache):
    link = cache / "uploads" / "data.txt"
    link.parent.mkdir()
    link.symlink_to("/etc/passwd")
    with pytest.raises(PathNotAllowed):
        check_path(str(link))
    from dashboard.data import prompt_set

    with pytest.raises(PathNotAllowed):
        prompt_set(str(link))


def test_names_and_hub_sources_pass(cache):
    for name in ("builtin", "gsm8k", "retrieval:512", "hf:openai/gsm8k:main:test"):
        assert check_source(name) == name


def test_peek_fields_shows_nothing_of_files_outside(cache, outside):
    from dashboard.data import peek_fields

    for name in ("secrets.json", "secrets.csv"):
        assert peek_fields(str(outside / name)) == []
        (cache / name).write_bytes((outside / name).read_bytes())
        assert "aws_secret_access_key" in peek_fields(str(cache / name))  # inside: allowed


def test_upload_errors_name_the_users_file(cache):
    from dashboard.data import prompt_set
    from dashboard.widgets import save_upload
    from pop_analysis.data.prompts import DatasetError

    bad = save_upload("my prompts.csv", b'prompt\nfine\n"never closed\n')
    with pytest.raises(DatasetError) as e:
        prompt_set(bad)
    assert str(e.value).startswith("my prompts.csv line 3: a quoted field")
    assert "uploads" not in str(e.value) and str(cache) not in str(e.value)
    good = save_upload("../../evil name.jsonl", b'{"prompt": "hello"}\n')
    assert Path(good).parent.parent == cache / "uploads" and Path(good).name == "evil name.jsonl"
    assert prompt_set(good).name == "evil name.jsonl"


# --- the pages -------------------------------------------------------------------------------

def app() -> AppTest:
    from dashboard.data import stored_entries, stored_payload

    stored_entries.clear()  # listings and payloads memoised for another test's store
    stored_payload.clear()
    return AppTest.from_file(APP, default_timeout=300).run()


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_loading_a_bad_stored_calibration_warns_and_keeps_the_page(embedded, cache):
    from pop_analysis.importance.calibrate import (CalibrationConfig, cached_calibration,
        list_calibrations)
    from pop_analysis.data.prompts import load_prompts
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
    assert "prefill has 5 entries, expected 30" in texts(at.warning)
    assert "missing or unreadable" in texts(at.error)
    at.run()  # and on the next rerun
    assert not at.exception


def test_local_path_outside_the_allowed_folders_is_refused_on_the_page(embedded, cache, outside):
    at = goto(app(), "calibrate")
    at.radio(key="cal.kind").set_value("local path").run()
    at.text_input(key="cal.path").set_value(str(outside / "secrets.json")).run()
    assert not at.exception
    shown = texts(at.selectbox) + " ".join(str(s.options) for s in at.selectbox)
    assert "aws_secret_access_key" not in shown  # no field list from a file outside
    at.button(key="cal.go").click().run()
    assert not at.exception
    assert "not a file the dashboard may read" in texts(at.error)
