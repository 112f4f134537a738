#!/usr/bin/env bash
# Set everything up (first run only), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install.sh
bash scripts/install_vllm.sh
bash scripts/install_browser.sh
exec .venv/bin/python -m pytest -q "$@"
