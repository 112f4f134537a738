"""Helpers of the vLLM engine tests: the serving venv's state and the driver subprocess
(pop_vllm/pop_vllm/driver.py, run in .venv-vllm; results come back as one JSON line)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pop_analysis.serving import venv

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"
MARK = "POP_DRIVER_RESULT "


def check_venv() -> None:
    """Fail (never skip) when the serving venv is missing or holds an older plugin."""
    try:
        venv.python()  # the check the CLI and the Serve page make
    except venv.ServingError as e:
        pytest.fail(str(e))


class Driver:
    """The driver running `jobs` in the background; `results()` waits for its JSON."""

    def __init__(self, name: str, jobs: list[dict], kv_cache_gib: int = 1):
        self.work = ROOT / "cache" / "vllm_test"  # kept: the last run's engine log is worth reading
        self.work.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work / f"{name}.log"
        spec = self.work / f"{name}.json"
        spec.write_text(json.dumps({"cache": str(ROOT / "cache"), "kv_cache_gib": kv_cache_gib,
                                    "jobs": jobs}))
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(VENV_PY), "-m", "pop_vllm.driver", str(spec)],
                                     cwd=self.work, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": ""},
                                     start_new_session=True)  # its own group: engines go with it

    def stop(self) -> None:
        """Wait for a normal exit; on a hang, end the driver's process group (engines included)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def results(self, timeout: float = 420) -> list[dict]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        text = self.log_path.read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(MARK)]
        if not lines:
            pytest.fail(f"the vLLM driver printed no result ({self.log_path}); its log ends:\n"
                        + text[-3000:])
        return json.loads(lines[-1][len(MARK):])["jobs"]


def ok(job: dict) -> dict:
    assert job["ok"], f"{job.get('error')} (engine log under cache/vllm_test/)"
    return job


def wait_until(cond, timeout: float, what: str) -> None:
    """Poll a condition (every 0.2 s) until it holds; fail with `what` after `timeout` seconds."""
    end = time.time() + timeout
    while not cond():
        assert time.time() < end, what
        time.sleep(0.2)


def token_major(blocks: torch.Tensor, n: int):
    """CPU_ATTN's paged blocks (B, Hkv, block, 2 Dh) -> K, V (Hkv, n, Dh): per block and head the
    keys are stored transposed (Dh, block) for the dot products, then the values (block, Dh)."""
    b, h, bs, two_d = blocks.shape
    d = two_d // 2
    raw = blocks.reshape(b, h, 2, bs * d)  # (B, Hkv, K|V, block * Dh)
    k = raw[:, :, 0].reshape(b, h, d, bs).transpose(2, 3)  # (B, Hkv, block, Dh)
    v = raw[:, :, 1].reshape(b, h, bs, d)  # (B, Hkv, block, Dh)
    join = lambda x: x.transpose(0, 1).reshape(h, b * bs, d)[:, :n]  # noqa: E731  (Hkv, n, Dh)
    return join(k), join(v)
