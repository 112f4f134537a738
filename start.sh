#!/usr/bin/env bash
# Set everything up (first run only) and open the dashboard on the embedded model.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/install.sh
exec .venv/bin/streamlit run dashboard/app.py "$@"
