"""Where a bench script keeps its result: cache/bench/NAME.json, also printed to stdout."""
from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "cache" / "bench"


def save(name: str, payload: dict) -> Path:
    """Write payload as indented JSON to cache/bench/<name>.json and print it."""
    text = json.dumps(payload, indent=1)
    FOLDER.mkdir(parents=True, exist_ok=True)
    path = FOLDER / f"{name}.json"
    path.write_text(text)
    print(text)
    return path
