"""The Serve page in a real browser (Debian's headless chromium through Playwright): start a POP
engine, generate through both sides, run a small load test, save screenshots under
artifacts/screenshots/; then end the dashboard with SIGTERM and check its engine went with it."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pop_analysis.serving import venv
from pop_analysis.serving.server import group_members
from pop_analysis.serving.venv import ServingError
from pop_analysis.speed.procs import children

from browser_wait import (
    PLOT,
    free_port,
    idle,
    open_page,
    set_number,
    shot,
    wait_healthy,
)

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def dashboard(tmp_path_factory, embedded):
    try:
        venv.python()
    except ServingError as e:
        pytest.fail(f"{e} (the Serve page needs it: bash {venv.INSTALL_SCRIPT})")
    from pop_analysis.store.paths import cache_dir

    tmp = tmp_path_factory.mktemp("browser_serve")
    (tmp / "cache").mkdir()
    (tmp / "cache" / "models").symlink_to(cache_dir() / "models", target_is_directory=True)
    port = free_port()
    env = {**os.environ, "POP_LAB_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
           "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        yield {"url": url, "proc": proc}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=15)
        log.close()


def test_serve_page_in_a_real_browser(dashboard, browser_page):
    page = browser_page
    page.goto(dashboard["url"])
    page.locator(PLOT).first.wait_for(timeout=120_000)
    idle(page)
    open_page(page, "Serve", "Serve")
    page.get_by_role("button", name="Start", exact=True).click()
    page.get_by_text(re.compile("Engines ready in")).wait_for(timeout=300_000)
    idle(page)
    engines = [p for p in children(dashboard["proc"].pid) if group_members(p)]
    assert engines, "no engine process group under the dashboard"

    set_number(page, "Max new tokens", 16)
    page.get_by_role("button", name="Generate", exact=True).click()
    page.get_by_text(re.compile(r"pop · TTFT")).wait_for(timeout=120_000)
    idle(page)
    shot(page, "serve_1_engine_and_generation")

    # The smallest load that still draws every chart: the page's flow is what is tested here
    # (the load test's numbers are the serving benchmarks'; test_serve_page.py checks its table).
    set_number(page, "Requests", 2)
    set_number(page, "Prompt tokens", 32)
    set_number(page, "Output tokens", 4)
    page.get_by_role("button", name="Run the load test").click()
    page.get_by_text(re.compile(r"Load test: 2 rates measured")).wait_for(timeout=600_000)
    idle(page)
    page.locator(PLOT).nth(3).wait_for(timeout=60_000)
    assert page.locator(PLOT).count() >= 4
    shot(page, "serve_2_load_test")

    # The dashboard ends (as on Ctrl-C / a service stop): its engine must end with it.
    dashboard["proc"].send_signal(signal.SIGTERM)
    dashboard["proc"].wait(timeout=60)
    end = time.time() + 30
    while any(group_members(p) for p in engines):
        assert time.time() < end, "the engine outlived the dashboard"
        time.sleep(0.2)
