"""The serving venv (.venv-vllm at the repository root): where it is, whether it is usable, and
building it with scripts/install_vllm.sh (as a subprocess whose output lines are progress)."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from pop_analysis.store.paths import REPO_ROOT

INSTALL_SCRIPT = "scripts/install_vllm.sh"
DOWNLOAD = "about 600 MB of downloads, about 2.5 GB on disk"
INSTALL_HINT = f"build it with `bash {INSTALL_SCRIPT}` ({DOWNLOAD})"


class ServingError(RuntimeError):
    """The serving engine cannot start or has stopped; the message is one line."""


def venv_dir() -> Path:
    """$POP_LAB_VLLM_VENV, else .venv-vllm at the repository root."""
    return Path(os.environ.get("POP_LAB_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def python() -> Path:
    """The serving venv's Python, or ServingError saying how to build (or rebuild) the venv."""
    venv = venv_dir()
    exe = venv / "bin" / "python"
    if not venv.exists():
        raise ServingError(f"the serving venv {venv.name} is missing: {INSTALL_HINT}")
    if not os.access(exe, os.X_OK):
        raise ServingError(f"the serving venv {venv} is broken (no bin/python): {INSTALL_HINT}")
    if not _vllm_installed(venv):
        raise ServingError(f"the serving venv {venv} is incomplete (vLLM is not installed): "
                           f"{INSTALL_HINT}")
    if not _plugin_current(venv):
        # an engine would run the older plugin: wrong tokens or a failing run-time switch
        raise ServingError(f"the POP plugin in {venv.name} is older than pop_vllm/ here: rebuild "
                           f"with `bash {INSTALL_SCRIPT}` (seconds: only the plugin is reinstalled)")
    return exe


def plugin_stale() -> bool:
    """True when vLLM is installed in the serving venv but its POP plugin is older than here."""
    venv = venv_dir()
    return _vllm_installed(venv) and not _plugin_current(venv)


def _vllm_installed(venv: Path) -> bool:
    return (venv / ".deps.sha").exists() and any(venv.glob("lib/python3*/site-packages/vllm"))


def _plugin_current(venv: Path) -> bool:
    """Whether the plugin stamp scripts/install_vllm.sh wrote matches pop_vllm/ here."""
    stamp = venv / ".plugin.sha"
    return stamp.exists() and stamp.read_text().strip() == plugin_hash()


def plugin_hash() -> str:
    """The hash scripts/install_vllm.sh stamps: pop_vllm's .py/.toml files in C order."""
    plugin = REPO_ROOT / "pop_vllm"
    files = sorted((p for p in plugin.rglob("*") if p.suffix in (".py", ".toml")
                    and "build" not in p.relative_to(REPO_ROOT).parts),
                   key=lambda p: str(p.relative_to(REPO_ROOT)).encode())
    h = hashlib.sha256()
    for p in files:
        h.update(p.read_bytes())
    return h.hexdigest()


def has_plugin() -> bool:
    """True when the POP plugin (pop_vllm/) is installed in the serving venv."""
    return any(venv_dir().glob("lib/python3*/site-packages/pop_vllm*"))


def ready() -> bool:
    try:
        python()
        return True
    except ServingError:
        return False


def install(on_line=None, cancel=None) -> int:
    """Run scripts/install_vllm.sh; each output line goes to on_line(line). Returns its exit
    code. `cancel`: a threading.Event that stops the script (its process group) when set."""
    proc = subprocess.Popen(["bash", INSTALL_SCRIPT], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if on_line is not None and line.strip():
                on_line(line.rstrip())
            if cancel is not None and cancel.is_set():
                break
    finally:
        if proc.poll() is None and cancel is not None and cancel.is_set():
            os.killpg(proc.pid, 15)
        proc.stdout.close()
    return proc.wait()
