"""Checks of stored importance runs, method comparisons and budgeted choices before they are
trusted (a stored entry that fails is a miss: store.load recomputes it). Field types come from
the result dataclasses (store.records.check_fields); the shapes the code indexes are checked here:
per-layer lists of the model's layer count, per-prompt matrices of n rows, square agreement
matrices, skip sets of distinct layers."""
from __future__ import annotations

from pop_analysis.importance.methods import METHODS
from pop_analysis.store.records import RecordError, check_fields, numbers

PART_NAMES = ("hooks", "dropone")


def _layers(n: object, n_layers: int | None) -> int:
    if type(n) is not int or n < 1:
        raise RecordError(f"n_layers is {n!r:.40}, not a positive integer")
    if n_layers is not None and n != n_layers:
        raise RecordError(f"the record is for {n} layers, the model has {n_layers}")
    return n


def matrix(rows, n_rows: int | None, width: int, where: str, nulls: bool = False) -> None:
    """A list of n_rows lists of `width` numbers (None allowed where `nulls`)."""
    if not isinstance(rows, list) or (n_rows is not None and len(rows) != n_rows):
        raise RecordError(f"{where} is not a list of {n_rows} rows")
    for i, row in enumerate(rows):
        numbers(row, f"{where}[{i}]", nulls)
        if len(row) != width:
            raise RecordError(f"{where}[{i}] has {len(row)} entries, expected {width}")


def skip_layers(xs, n_layers: int, where: str) -> None:
    if not isinstance(xs, list) or any(type(x) is not int or not 0 <= x < n_layers for x in xs) \
            or len(set(xs)) != len(xs) or len(xs) >= n_layers:
        raise RecordError(f"{where} is not a skip set of distinct layers of 0..{n_layers - 1}")


def check_part(payload, n_layers: int, n: int) -> None:
    """A stored part of an importance run: per-prompt matrices (n, L) of its series."""
    if not isinstance(payload, dict) or payload.get("part") not in PART_NAMES:
        raise RecordError("not an importance part (hooks or dropone)")
    _layers(payload.get("n_layers"), n_layers)
    if payload.get("n_samples") != n or not isinstance(payload.get("samples"), dict):
        raise RecordError(f"the part holds {payload.get('n_samples')!r:.20} prompts, expected {n}")
    for key, rows in payload["samples"].items():
        if key == "triangle":
            matrix(rows, n_layers, n_layers, "samples.triangle", nulls=True)
        else:
            matrix(rows, n, n_layers, f"samples.{key}")


def _fields(cls, payload) -> None:
    if not isinstance(payload, dict):
        raise RecordError("the payload is not an object")
    check_fields(cls, payload)


def check_result(payload, cls, n_layers: int | None = None) -> None:
    """A stored importance run (cls: methods_run.ImportanceResult)."""
    _fields(cls, payload)
    L = _layers(payload["n_layers"], n_layers)
    bad = [m for m in payload["methods"] if m not in METHODS]
    if bad or not payload["methods"]:
        raise RecordError(f"methods {payload['methods']!r:.60} are not known methods")
    for key, values in payload["series"].items():
        matrix([values], 1, L, f"series.{key}")
    for key, rows in payload["samples"].items():
        if key not in payload["series"]:
            raise RecordError(f"samples.{key} has no series")
        matrix(rows, payload["n_samples"], L, f"samples.{key}")
    agreement(payload["agreement"], list(payload["series"]))
    tri = payload.get("triangle")
    if tri is not None:
        if not isinstance(tri, list) or len(tri) != L:
            raise RecordError(f"triangle has no row per layer ({L})")
        for l, row in enumerate(tri):
            matrix([row], 1, L - l, f"triangle[{l}]", nulls=True)


def agreement(d, names: list[str]) -> None:
    """compare.Agreement as stored: its names are the series', its matrices square."""
    if not isinstance(d, dict) or d.get("names") != names:
        raise RecordError("agreement does not name the result's series")
    M = len(names)
    for key in ("kendall", "spearman"):
        matrix(d.get(key), M, M, f"agreement.{key}", nulls=True)
    for key in ("kendall_ci", "spearman_ci"):
        rows = d.get(key)
        if not isinstance(rows, list) or len(rows) != M:
            raise RecordError(f"agreement.{key} is not {M} rows")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != M:
                raise RecordError(f"agreement.{key}[{i}] is not {M} cells")
            for j, cell in enumerate(row):
                if cell is not None:
                    matrix([cell], 1, 2, f"agreement.{key}[{i}][{j}]")


def check_comparison(payload, cls, n_layers: int | None = None) -> None:
    """A stored comparison (cls: methods_compare.ComparisonResult): rows with known methods and
    skip sets, verdicts with lines."""
    _fields(cls, payload)
    L = _layers(payload["n_layers"], n_layers)
    if not payload["rows"] or not payload["verdicts"]:
        raise RecordError("a comparison without rows or verdicts")
    for i, row in enumerate(payload["rows"]):
        if not isinstance(row, dict) or row.get("method") not in METHODS:
            raise RecordError(f"rows[{i}] names no known method")
        skip_layers(row.get("skip_layers"), L, f"rows[{i}].skip_layers")
        numbers([row.get(k) for k in ("budget", "k", "ideal_speedup", "continuation_nll_delta")],
                f"rows[{i}]", nulls=True)
    for i, v in enumerate(payload["verdicts"]):
        if not isinstance(v, dict) or not isinstance(v.get("line"), str) \
                or v.get("best") not in METHODS:
            raise RecordError(f"verdicts[{i}] has no line or best method")


def check_choice(payload, cls, n_layers: int | None = None) -> None:
    """A stored budgeted choice (cls: choose.ChoiceResult): the chosen set and every
    candidate's set fit the model."""
    _fields(cls, payload)
    L = _layers(payload["n_layers"], n_layers)
    skip_layers(payload["chosen"], L, "chosen")
    matrix([payload["ranking"]], 1, L, "ranking")
    for i, c in enumerate(payload["candidates"]):
        if not isinstance(c, dict) or type(c.get("meets")) is not bool:
            raise RecordError(f"candidates[{i}] has no verdict")
        skip_layers(c.get("skip_layers"), L, f"candidates[{i}].skip_layers")


def check_certificate(payload, cls, n_layers: int | None = None) -> None:
    """A stored certified choice (cls: certify.CertifyResult): the certified set and every set
    of the sequence fit the model, the sequence is nested, the levels are in (0, 1), the bound is
    a rate, and a certified set passed its test with every set before it."""
    _fields(cls, payload)
    L = _layers(payload["n_layers"], n_layers)
    skip_layers(payload["certified"], L, "certified")
    matrix([payload["ranking"]], 1, L, "ranking")
    numbers([payload["alpha"], payload["delta"], payload["bound"], payload["rate"]], "levels")
    if not (0 < payload["alpha"] < 1 and 0 < payload["delta"] < 1 and 0 <= payload["bound"] <= 1):
        raise RecordError("alpha, delta or the bound is not a rate")
    if len(payload["splits"]) != 3 or not payload["sequence"]:
        raise RecordError("a certificate needs three splits and a sequence")
    prev: set = set()
    for i, c in enumerate(payload["sequence"]):
        if not isinstance(c, dict):
            raise RecordError(f"sequence[{i}] is not an object")
        skip_layers(c.get("skip_layers"), L, f"sequence[{i}].skip_layers")
        if not prev < set(c["skip_layers"]):
            raise RecordError(f"sequence[{i}] does not contain the set before it")
        prev = set(c["skip_layers"])
    if payload["met"]:
        upto = [c["skip_layers"] for c in payload["sequence"]].index(payload["certified"]) \
            if payload["certified"] in [c["skip_layers"] for c in payload["sequence"]] else None
        if upto is None or not all(c.get("passed") for c in payload["sequence"][:upto + 1]):
            raise RecordError("the certified set did not pass with every set before it")
