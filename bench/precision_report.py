"""Markdown tables of bench/precision_bench.py's results (filled in as the stages finish)."""
from __future__ import annotations

import json
from pathlib import Path


def report(out: Path) -> str:
    lines = []
    for path in sorted(out.glob("*.json")):
        d = json.loads(path.read_text())
        lines.append(f"## {path.stem}\n\n{len(d.get('rows', []))} rows")
    return "\n\n".join(lines)
