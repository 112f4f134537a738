"""Time to first content: `streamlit run` on a fresh results store, real chromium, the first page.

    PYTHONPATH=tests .venv/bin/python bench/first_content_bench.py --rounds 3   # tests/: browser helpers

Each round starts a new server (a new process: nothing imported or loaded yet) on a temporary
results store with only the converted models linked in, opens the first page once the server
answers its health check, and records, from the server's launch and from its first answer:
the Overview's title, its first chart (the recorded step-through of the stored example), and
the model loaded (the sidebar's "loads in this server"). Also the other processes' CPU use over
the round, so a busy machine shows. Prints one JSON object, writes a new file under bench/raw/first_content_bench/.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_results import save
from browser_wait import ARGS, CHROMIUM, free_port, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PLOT = ".js-plotly-plot"


def server(store: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "POP_LAB_CACHE": str(store), "OMP_NUM_THREADS": "2",
           "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
           "--server.headless", "true", "--server.port", str(port), "--server.address",
           "127.0.0.1", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    return subprocess.Popen(cmd, cwd=store.parent, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def one_round(browser) -> dict:
    from pop_analysis.speed.timing import other_cpu_seconds

    with tempfile.TemporaryDirectory(prefix="poplab_first_") as tmp:
        store = Path(tmp) / "cache"
        store.mkdir()
        (store / "models").symlink_to(ROOT / "cache" / "models", target_is_directory=True)
        port, others0 = free_port(), other_cpu_seconds()
        t0 = time.time()
        proc = server(store, port)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, proc)
            ready = time.time()
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.locator("h1").first.wait_for(timeout=120_000)
            text = time.time()
            page.locator(PLOT).first.wait_for(timeout=120_000)
            chart = time.time()
            page.get_by_text("loads in this server: 1").wait_for(timeout=300_000)
            model = time.time()
            page.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        others = other_cpu_seconds()
        busy = None if None in (others0, others) else (others - others0) / (time.time() - t0)
        return {"server_ready_s": round(ready - t0, 2), "text_after_ready_s": round(text - ready, 2),
                "chart_after_ready_s": round(chart - ready, 2),
                "chart_after_launch_s": round(chart - t0, 2),
                "model_loaded_after_ready_s": round(model - ready, 2),
                "other_processes_cores": None if busy is None else round(busy, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    rounds = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        for _ in range(args.rounds):
            rounds.append(one_round(browser))
        browser.close()
    keys = [k for k in rounds[0] if k != "other_processes_cores"]
    out = {"rounds": rounds, "median": {k: statistics.median(r[k] for r in rounds) for k in keys},
           "load_average_end": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    save("first_content_bench", args, out)


if __name__ == "__main__":
    main()
