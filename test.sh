#!/usr/bin/env bash
# Set everything up (first run only), then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
# The two venvs install side by side (each install is mostly one core unpacking wheels); their
# builds of this tree's own packages take turns (a lock in both scripts).
vllm_log="$(mktemp)"
bash scripts/install_vllm.sh >"$vllm_log" 2>&1 &
vllm_pid=$!
if ! bash scripts/install.sh; then
  wait "$vllm_pid" || true
  cat "$vllm_log"; rm -f "$vllm_log"; exit 1
fi
vllm_ok=0
wait "$vllm_pid" || vllm_ok=$?
cat "$vllm_log"; rm -f "$vllm_log"
[ "$vllm_ok" = 0 ] || exit "$vllm_ok"
bash scripts/install_browser.sh
# Two workers: most of the suite's time is vLLM engines and browser sessions starting, several
# processes each, so two modules at a time keep both cores busy (on two cores a third worker only
# makes them take turns). A module runs whole on one worker (its engine started once),
# in the order tests/conftest.py collects them (long tiers first; xdist would otherwise start the
# modules with the most tests, the short unit ones, and leave the engines for the end).
exec .venv/bin/python -m pytest -q -n "${POP_TEST_WORKERS:-2}" --dist loadfile \
  --no-loadscope-reorder "$@"
