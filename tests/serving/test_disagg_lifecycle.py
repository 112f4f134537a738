"""No process of a disaggregated topology outlives what ended it (`serve --disaggregated` on the
embedded SmolLM2-135M, two topologies):

- the proxy killed: the CLI notices, says so in one line, exits non-zero and stops both
  instances;
- the CLI itself SIGKILLed (no atexit, no cleanup of its own): each member's watchdog sees its
  parent gone and ends its process group.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pop_analysis.serving.server import group_members

from vllm_driver import check_venv, wait_until

ROOT = Path(__file__).resolve().parents[2]


def start(tmp_path) -> tuple[subprocess.Popen, dict]:
    p = subprocess.Popen([sys.executable, "-m", "pop_analysis", "serve", "--disaggregated",
                          "--skip", "20-29", "--port", "0", "--max-model-len", "512",
                          "--kv-dir", str(tmp_path), "--json"], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    if not line:
        p.wait()
        pytest.fail(f"serve --disaggregated exited: {p.stderr.read()[-2000:]}")
    return p, json.loads(line)


def gone(info: dict) -> None:
    for name, member in info["members"].items():
        wait_until(lambda: not group_members(member["pgid"]), 40, f"the {name} outlived it")


@pytest.fixture(scope="module")
def venv_ready(embedded):
    check_venv()


def test_killed_proxy_ends_the_topology_in_one_line(venv_ready, tmp_path):
    p, info = start(tmp_path)
    try:
        proxy = info["members"]["proxy"]["pgid"]
        router = [pid for pid in group_members(proxy) if pid != proxy]
        os.kill(router[0], signal.SIGKILL)
        p.wait(timeout=90)
        err = p.stderr.read().strip().splitlines()
        assert p.returncode == 1 and "the proxy instance died" in err[-1], err[-3:]
        gone(info)
    finally:
        p.kill()
        p.wait()


def test_killed_parent_leaves_no_process(venv_ready, tmp_path):
    p, info = start(tmp_path)
    try:
        assert all(group_members(m["pgid"]) for m in info["members"].values())
        p.kill()  # SIGKILL: no atexit hook runs
        p.wait(timeout=10)
        gone(info)
    finally:
        p.kill()
        p.wait()
