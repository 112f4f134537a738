"""Dashboard timings in real chromium against `streamlit run`: the first page, page switches,
and what overlaying 5 stored calibrations adds to the Calibrate page.

Run it on a quiet machine:

    PYTHONPATH=tests .venv/bin/python bench/dashboard_bench.py --rounds 5   # tests/: the browser helpers

It fills a temporary results store with 6 small calibrations of the embedded model (the models
folder is linked in), starts a server on a free port (stopped by its pid), and drives Debian's
chromium with Playwright. Overlay cost: the Calibrate page's redraw after a toggle (click until
the app is idle and the chart drawn), alternating 0 and 5 overlays, medians over the rounds;
also the page script's own time for the same rerun in AppTest (server side only).
Prints one JSON object and writes it to a new file under bench/raw/dashboard_bench/.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench_results import save
from browser_wait import ARGS, CHROMIUM, free_port, wait_healthy

PLOT = ".js-plotly-plot"


def fill_store(store: Path, n: int = 6) -> None:
    """n stored calibrations (2 samples, 4 tokens, different seeds) in `store`."""
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.engine.models import load_model
    from pop_analysis.importance import calibrate as cal

    lm = load_model("smollm2-135m", device="cpu")
    prompts = load_prompts("builtin", limit=2)
    for seed in range(n):
        cal.cached_calibration(lm, prompts, cal.CalibrationConfig(n_samples=2, max_new_tokens=4,
                                                                  seed=seed, batch_size=2))


def idle(page, timeout_s: float = 120) -> None:
    page.wait_for_timeout(150)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden",
                                                           timeout=timeout_s * 1000)


def timed(page, action) -> float:
    t0 = time.perf_counter()
    action()
    idle(page)
    page.locator(PLOT).first.wait_for()
    return time.perf_counter() - t0


def browser_part(url: str, rounds: int) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = b.new_context(viewport={"width": 1400, "height": 1200}).new_page()
        t0 = time.perf_counter()
        page.goto(url)
        page.locator(PLOT).first.wait_for(timeout=180_000)
        idle(page)
        out["first_page_after_connect_s"] = round(time.perf_counter() - t0, 2)
        nav = page.locator('[data-testid="stSidebarNav"]')
        switches = []
        for _ in range(rounds):
            for title in ("Calibrate", "Skip set", "Drift", "Sweeps", "Generate", "Overview"):
                t0 = time.perf_counter()
                nav.get_by_text(title, exact=True).click()
                idle(page)
                switches.append(time.perf_counter() - t0)
        out["page_switch_s"] = summary(switches)
        nav.get_by_text("Calibrate", exact=True).click()
        idle(page)
        page.get_by_text(re.compile("Stored calibrations")).click()
        idle(page)
        page.get_by_test_id("stExpanderDetails").get_by_role("button", name="Load").click()
        idle(page)
        box = page.get_by_role("combobox", name="Overlay on the importance chart")
        toggle = page.get_by_text("95% interval bands")
        plain, over = [], []
        for _ in range(rounds):  # alternating: 0 overlays, 5 overlays
            plain.append(timed(page, toggle.click))
            for _ in range(5):
                box.click()
                page.locator('[role="option"]').first.click()
                idle(page)
            page.keyboard.press("Escape")
            over.append(timed(page, toggle.click))
            page.get_by_test_id("stMultiSelect").get_by_role("button", name="Clear all").click()
            idle(page)
            assert not page.get_by_text("Overlaid:").count(), "the overlays were not removed"
        out["calibrate_redraw_no_overlay_s"] = summary(plain)
        out["calibrate_redraw_5_overlays_s"] = summary(over)
        out["overlay_adds_s"] = round(statistics.median(over) - statistics.median(plain), 3)
        b.close()
    return out


def apptest_part(rounds: int) -> dict:
    """The page script alone: Calibrate rerun with 0 and 5 overlays (AppTest, same process)."""
    from streamlit.testing.v1 import AppTest

    from dashboard.session import cached

    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=300).run()
    at.switch_page("../pages/calibrate.py").run()
    at.button(key="cal.load").click().run()
    keys = [e["key"] for e in cached.stored_entries("calibration")][:5]
    plain, over = [], []
    for _ in range(rounds):
        for chosen, sink in (([], plain), (keys, over)):
            at.multiselect(key="cal.overlay").set_value(chosen).run()
            t0 = time.perf_counter()
            at.toggle(key="cal.bands").set_value(not at.toggle(key="cal.bands").value).run()
            sink.append(time.perf_counter() - t0)
    assert not at.exception, [e.value for e in at.exception]
    return {"script_no_overlay_s": summary(plain), "script_5_overlays_s": summary(over),
            "script_overlay_adds_s": round(statistics.median(over) - statistics.median(plain), 3)}


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 3), "min": round(xs[0], 3),
            "max": round(xs[-1], 3), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from pop_analysis.store.paths import cache_dir

    models = cache_dir() / "models"
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "cache"
        store.mkdir()
        (store / "models").symlink_to(models, target_is_directory=True)
        os.environ["POP_LAB_CACHE"] = str(store)
        fill_store(store)
        result = {"load_per_core_at_start": round(os.getloadavg()[0] / (os.cpu_count() or 1), 2),
                  "threads": os.environ.get("OMP_NUM_THREADS", "default")}
        port = free_port()
        t_launch = time.perf_counter()
        cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
               "--server.headless", "true", "--server.port", str(port), "--server.address",
               "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
        proc = subprocess.Popen(cmd, cwd=tmp, env={**os.environ, "OMP_NUM_THREADS": "2"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc)
            result["server_ready_s"] = round(time.perf_counter() - t_launch, 2)
            result.update(browser_part(f"http://127.0.0.1:{port}", args.rounds))
            result["first_page_after_launch_s"] = round(result["server_ready_s"]
                                                        + result["first_page_after_connect_s"], 2)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        result.update(apptest_part(args.rounds))
    save("dashboard_bench", args, result)

if __name__ == "__main__":
    main()
