"""Where POP Lab keeps what it converts and computes."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # pop_analysis/store/paths.py -> the repository


def cache_dir() -> Path:
    """cache/ at the repository root, or $POP_LAB_CACHE when set."""
    return Path(os.environ.get("POP_LAB_CACHE") or REPO_ROOT / "cache")


def shared_data_dir() -> Path:
    """The read-only data sets: $POP_LAB_DATA, else ../shared/data beside the repository."""
    return Path(os.environ.get("POP_LAB_DATA") or REPO_ROOT.parent / "shared" / "data")
