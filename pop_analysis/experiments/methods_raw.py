"""The methods comparison's raw results in the repository (docs/reproduction/raw/<model>/
methods.json), and the parts of its report regenerated from them.

A raw file holds every row of a comparison (method, budget, shape, k, the set, ΔNLL with its 95%
interval; the random draws' ΔNLL) and the paired comparisons its verdicts rest on (a set against
the tail's, over the same items), plus, where they were recomputed, per-item NLL on the items.
From it the verdict lines, the tail baseline's counts and the ΔNLL tables are regenerated with
the honest counting of methods_verdicts.py; tests/unit/test_docs_methods.py fails when
docs/reproduction.md disagrees.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from pop_analysis.experiments import methods_verdicts as mv
from pop_analysis.importance.methods import METHODS
from pop_analysis.store.records import RecordError, numbers

TITLES = {m.title: key for key, m in METHODS.items()}
_NUM = r"([+-]\d+\.\d+)"
_CELL = re.compile(rf"{_NUM} \[{_NUM}, {_NUM}\] · (.+)")
_HEAD = re.compile(r"(\d+)% \((\d+) layers\)")
_VS = re.compile(rf"vs tail {_NUM} \[{_NUM}, {_NUM}\]")


def parse_tables(section: str) -> list[dict]:
    """The rows of a published report's ΔNLL tables (block and free) as comparison rows."""
    rows = []
    for shape in ("block", "free"):
        head = f"ΔNLL of each method's set ({shape}; ΔNLL [95%] · layers)"
        lines = section.split(head, 1)[1].strip().splitlines()
        cols = [(float(b) / 100, int(k)) for b, k in _HEAD.findall(lines[0])]
        for line in lines[2:]:
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = cells[0].split(" (min")[0]
            for (budget, k), cell in zip(cols, cells[1:]):
                rows += _cell_rows(TITLES[name], budget, shape, k, cell)
    return rows


def _cell_rows(method: str, budget: float, shape: str, k: int, cell: str) -> list[dict]:
    base = {"method": method, "budget": budget, "shape": shape, "k": k}
    if method == "random":
        return [base | {"seed": None, "set": None, "continuation_nll_delta": float(x)}
                for x in cell.split(" / ")]
    d, lo, hi, layers = _CELL.fullmatch(cell).groups()
    return [base | {"set": layers, "continuation_nll_delta": float(d),
                    "continuation_nll_delta_ci": [float(lo), float(hi)]}]


def parse_paired(section: str, rows: list[dict]) -> list[list]:
    """The paired comparisons behind the published verdict lines: [a, b, mean a - b, lo, hi];
    where a line says only that the tail's set beats another's, the interval is recorded as
    lying below 0 with no value (the per-item data of that run were not stored)."""
    out = []
    block = section.split("### Verdicts", 1)[1].split("###", 1)[0]
    for line in block.strip().splitlines()[1:]:
        m = re.match(r"- (\d+)% \((\d+) layers, (\w+)\): best (.+?) \(layers (.+?), ΔNLL", line)
        if not m:
            continue
        budget, shape = float(m.group(1)) / 100, m.group(3)
        cell = {r["method"]: r["set"] for r in rows if r["budget"] == budget and r["shape"] == shape
                and r["method"] != "random"}
        vs = _VS.search(line)
        if vs:
            out.append([m.group(5), cell["tail"], *map(float, vs.groups())])
        beats = line.split("the tail beats ", 1)[1] if "the tail beats " in line else ""
        for title in filter(None, (t.strip() for t in beats.split(", "))):
            pair = [cell["tail"], cell[TITLES[title]], None, None, None]
            if pair not in out:
                out.append(pair)
    return out


def paired_lookup(paired: list[list]):
    """paired(a, b) from the recorded comparisons (either order), None when not recorded."""
    table = {}
    for a, b, v, lo, hi in paired:
        if v is None:  # only "clear of 0, below" is known
            table[(a, b)] = (math.nan, (-math.inf, -math.inf))
            table[(b, a)] = (math.nan, (math.inf, math.inf))
        else:
            table[(a, b)], table[(b, a)] = (v, (lo, hi)), (-v, (-hi, -lo))
    return lambda a, b: table.get((a, b))


def check_raw(d) -> dict:
    """A raw methods file: rows with known methods and numbers, paired entries of five."""
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list) or not d["rows"]:
        raise RecordError("a raw methods file holds no rows")
    for i, r in enumerate(d["rows"]):
        if not isinstance(r, dict) or r.get("method") not in METHODS or r.get("shape") not in \
                ("block", "free") or type(r.get("k")) is not int:
            raise RecordError(f"rows[{i}] is not a comparison row")
        numbers([r.get("budget"), r.get("continuation_nll_delta")], f"rows[{i}]")
    for i, p in enumerate(d.get("paired", [])):
        if not isinstance(p, list) or len(p) != 5 or not all(isinstance(x, str) for x in p[:2]):
            raise RecordError(f"paired[{i}] is not [set, set, mean, low, high]")
        numbers(p[2:], f"paired[{i}]", nulls=True)
    return d


def load_raw(path: Path) -> dict:
    return check_raw(json.loads(Path(path).read_text()))


def verdicts_of(raw: dict) -> list[dict]:
    """The verdicts regenerated from a raw file (ties named, budgets of one k merged)."""
    return mv.verdicts(raw["rows"], paired_lookup(raw.get("paired", [])))
