#!/usr/bin/env bash
# Set everything up (first run only), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install.sh
bash scripts/install_vllm.sh
bash scripts/install_browser.sh
# Three workers on any machine: most of the suite's time is vLLM engines and browser sessions
# starting, which leave cores idle; a module runs whole on one worker (its engine started once),
# in the order tests/conftest.py collects them (long tiers first; xdist would otherwise start
# the modules with the most tests, the short unit ones, and leave the engines for the end).
exec .venv/bin/python -m pytest -q -n "${POP_TEST_WORKERS:-3}" --dist loadfile \
  --no-loadscope-reorder "$@"
