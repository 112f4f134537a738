"""The browser tier's fixtures: a Streamlit server on a free localhost port (started from a
foreign working directory on a temporary results store, stopped by its pid) and one headless
Debian chromium page driven by Playwright (never a downloaded browser)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from browser_wait import ARGS, CHROMIUM, free_port, install, wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedded):
    """A streamlit server started from a foreign cwd on a temp results store; stopped by pid."""
    from pop_analysis.store.paths import cache_dir

    tmp = tmp_path_factory.mktemp("browser")
    store = tmp / "cache"
    store.mkdir()
    (store / "models").symlink_to(cache_dir() / "models", target_is_directory=True)
    port = free_port()
    env = {**os.environ, "POP_LAB_CACHE": str(store), "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
           "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    log = open(tmp / "server.log", "w")
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        yield {"url": url, "t_launch": t0, "t_healthy": time.time(), "log": tmp / "server.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install_browser.sh")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium_profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM,
                                                   headless=True, args=ARGS,
                                                   viewport={"width": 1400, "height": 1000},
                                                   accept_downloads=True)
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            install(page)
            yield page
        finally:
            ctx.close()
