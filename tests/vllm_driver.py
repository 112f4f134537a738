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


# A tiny random Llama vLLM's CPU attention runs (head_dim >= 32), for fast engine tests.
TINY_SHAPE = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None, torch_dtype="float32")


def tiny_llama(name: str):
    """(model, folder): the tiny Llama (seed 7, a sharpened lm_head: random init is near-uniform,
    no greedy ties), saved under cache/vllm_test/NAME for the engine to load."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(7)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY_SHAPE)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    folder = ROOT / "cache" / "vllm_test" / name
    model.save_pretrained(folder)
    return model, folder
