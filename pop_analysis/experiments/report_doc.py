"""One reproduction document, one section per model: rendering a model's report replaces only
that model's section (between its markers) and keeps every other model's as it stands."""
from __future__ import annotations

import re
from pathlib import Path

TITLE = "# Reproducing the paper's findings"
INTRO = ("One section per model, each rendered by `python -m pop_analysis report --model NAME` "
         "(it replaces only its own section). The same verdict lines in every section.")


def slug(model: str) -> str:
    """A folder name for a model's figures (a registry name as is; a path cut to its tail)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_.")[-60:] or "model"


def _markers(model: str) -> tuple[str, str]:
    return f"<!-- report {model} -->", f"<!-- /report {model} -->"


def section(model: str, lines: list[str]) -> list[str]:
    """A model's rendered report as a section: its headings one level down, within markers."""
    start, end = _markers(model)
    return [start, *(f"#{line}" if line.startswith("#") else line for line in lines), end]


def place(out: Path, model: str, lines: list[str], after: str | None = None) -> str:
    """The document with `model`'s section put in: replacing its old section, else right after
    the section named `after` (when there is one), else appended; a missing file, or one
    without sections, becomes a new document."""
    block = "\n".join(section(model, lines))
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    start, end = _markers(model)
    if start in old and end in old:
        head, rest = old.split(start, 1)
        return head + block + rest.split(end, 1)[1]
    prev_end = _markers(after)[1] if after else None
    if prev_end and prev_end in old:
        head, rest = old.split(prev_end, 1)
        return head + prev_end + "\n\n" + block + rest
    if "<!-- report " in old:
        return old.rstrip("\n") + "\n\n" + block + "\n"
    return f"{TITLE}\n\n{INTRO}\n\n{block}\n"
