"""Checks of stored results before they are trusted.

A record read back from cache/results/ may be truncated, edited by hand, written by another
version or for another model. `check(kind, cls, payload)` compares it with the result dataclass's
field types (JSON types; numbers finite, or None where a NaN was stored) and with the shape the
code indexes (per-layer lists as long as the layer count, rows of equal width), and raises
RecordError naming the first field that does not fit. The store then treats the entry as a miss.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing

from pop_analysis.errors import InputError
from pop_analysis.store.schema import SweepRow

STAGES = ("prefill", "decode")
DRIFT_QUANTITIES = ("hidden", "k", "v", "attn_out")
# Fields whose numbers may be None: a NaN in memory is stored as null (schema.plain), e.g. a
# cosine with no cached position under a sliding window, or a quality metric not measured.
ALL = frozenset({"*"})
NAN_AS_NULL = {
    "drift": frozenset(f"{q}_{s}" for q in ("hidden", "k", "v", "attn_out")
                       for s in ("cos", "min", "tok")) | {"quantiles"},
    "sweep_row": ALL,
    "drift_by_length": ALL,
}
SHAPE_FIELDS = ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "intermediate",
                "vocab", "max_positions")  # adapter.Shape, read by the ideal-speedup counts
DERIVED = {"lengths"}  # expectations on something other than a field (drift rows' lengths)


class RecordError(InputError):
    """A stored record that does not match what the code expects; the message says where."""


def check(kind: str, cls, payload, n_layers: int | None = None, expect: dict | None = None) -> None:
    """Raise RecordError unless `payload` is a valid `kind` record (of `cls`, a schema.Record).

    n_layers: the current model's layer count (per-layer lists must have it); expect: field values
    the record must hold (e.g. the prompt length it was asked for).
    """
    if not isinstance(payload, dict):
        raise RecordError(f"the payload is a {type(payload).__name__}, not an object")
    nulls, expect = NAN_AS_NULL.get(kind, frozenset()), expect or {}
    if cls is not None:
        check_fields(cls, payload, nulls)
    for name, want in expect.items():
        if name not in DERIVED and payload.get(name) != want:
            raise RecordError(f"{name} is {_short(payload.get(name))}, expected {_short(want)}")
    shape = _SHAPES.get(kind)
    if shape is not None:
        shape(payload, n_layers, expect)


# --- types from the dataclass ----------------------------------------------------------------

@functools.cache
def _hints(cls) -> tuple[tuple[str, object, bool], ...]:
    """(name, type, required) per field of a dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls))


def check_fields(cls, d: dict, nulls: frozenset = frozenset(), where: str = "") -> None:
    """Every field of `cls` present in `d` has its declared type; required fields are present.
    Numbers in the fields named in `nulls` (ALL: every field) may be None."""
    for name, hint, required in _hints(cls):
        if name not in d:
            if required:
                raise RecordError(f"{where}{name} is missing")
            continue
        _value(d[name], hint, f"{where}{name}", nulls is ALL or name in nulls)


def _value(v, hint, where: str, nulls: bool) -> None:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if v is None and type(None) in args:
            return
        (hint,) = [a for a in args if a is not type(None)]  # the record types use X | None only
        return _value(v, hint, where, nulls)
    if hint is float:
        return _number(v, where, nulls)
    if hint is int:
        if not _is_int(v):
            raise RecordError(f"{where} is {_short(v)}, not an integer")
        return None
    if hint in (str, bool, dict):
        if not isinstance(v, hint) or (hint is not bool and isinstance(v, bool)):
            raise RecordError(f"{where} is {_short(v)}, not a {hint.__name__}")
        return None
    if origin is list:
        if not isinstance(v, list):
            raise RecordError(f"{where} is {_short(v)}, not a list")
        (item,) = typing.get_args(hint) or (object,)
        if item is float:
            return numbers(v, where, nulls)
        for i, x in enumerate(v):
            _value(x, item, f"{where}[{i}]", nulls)
        return None
    if origin is dict:
        return _value(v, dict, where, nulls)
    return None  # object / Any: anything JSON holds


def _is_int(v) -> bool:
    return type(v) is int


def _finite(v) -> bool:
    """A float or int that is finite as a float (JSON also holds NaN, Infinity and 10**400)."""
    return (type(v) is float and math.isfinite(v)) or (type(v) is int and abs(v) < 2 ** 1000)


def _number(v, where: str, nulls: bool) -> None:
    if not (_finite(v) or (nulls and v is None)):
        raise RecordError(f"{where} is {_short(v)}, not a finite number")


def numbers(xs, where: str, nulls: bool = False) -> None:
    """A list of finite numbers (None allowed where `nulls`)."""
    if not isinstance(xs, list):
        raise RecordError(f"{where} is {_short(xs)}, not a list of numbers")
    kinds = set(map(type, xs))  # the fast path runs in C: a drift record holds ~25k numbers
    if nulls and type(None) in kinds:
        kinds.discard(type(None))
        xs_ = [v for v in xs if v is not None]
    else:
        xs_ = xs
    if kinds <= {float, int}:
        try:
            if math.isfinite(math.fsum(xs_)):
                return
        except OverflowError:
            pass
    for i, v in enumerate(xs):  # find the culprit for the message
        if not (_finite(v) or (nulls and v is None)):
            raise RecordError(f"{where}[{i}] is {_short(v)}, not a finite number")
    raise RecordError(f"{where} sums beyond the float range")


# --- shapes ----------------------------------------------------------------------------------

def _layers(d: dict, n_layers: int | None) -> int:
    n = d.get("n_layers")
    if not _is_int(n) or n < 1:
        raise RecordError(f"n_layers is {_short(n)}, not a positive integer")
    if n_layers is not None and n != n_layers:
        raise RecordError(f"the record is for {n} layers, the model has {n_layers}")
    return n


def _length(xs, n: int, where: str) -> None:
    if len(xs) != n:
        raise RecordError(f"{where} has {len(xs)} entries, expected {n}")


def _matrix(rows, n_rows: int, width: int | None, where: str) -> int:
    """rows (numbers already checked by the field types): n_rows lists of equal width (= width
    when given); returns the width."""
    _length(rows, n_rows, where)
    for i, row in enumerate(rows):
        width = len(row) if width is None else width
        _length(row, width, f"{where}[{i}]")
    return width or 0


def _stage_lists(d: dict, name: str, n: int, nulls: bool, optional: bool) -> None:
    v = d.get(name)
    if v is None and optional:
        return
    if not isinstance(v, dict):
        raise RecordError(f"{name} is {_short(v)}, not an object with prefill and decode")
    for stage in STAGES:
        numbers(v.get(stage), f"{name}.{stage}", nulls)
        _length(v[stage], n, f"{name}.{stage}")


def _layer_ids(xs, n: int, where: str) -> None:
    bad = [x for x in xs if not 0 <= x < n]
    if bad or len(set(xs)) != len(xs):
        raise RecordError(f"{where} {_short(xs)} are not distinct layers of 0..{n - 1}")


def _calibration(d: dict, n_layers: int | None, expect: dict) -> None:
    n = _layers(d, n_layers)
    _shape(d.get("shape"), n)
    samples = d["n_samples"]
    if samples < 1:
        raise RecordError(f"n_samples is {samples}, not positive")
    for name in ("prefill", "decode", "prefill_std", "decode_std"):
        _length(d[name], n, name)
    for name in ("prefill_samples", "decode_samples"):
        _matrix(d[name], samples, n, name)
    _stage_lists(d, "block_influence", n, False, optional=False)
    for name in ("loo", "loo_taylor"):
        _stage_lists(d, name, n, False, optional=True)
    corr = d.get("rank_corr")
    if corr is not None:
        if not set(STAGES) <= set(corr):
            raise RecordError("rank_corr lacks prefill or decode")
        numbers([corr[s] for s in STAGES], "rank_corr", nulls=True)
    for name in ("prompt_tokens", "response_tokens", "loss"):
        if d.get(name):
            _length(d[name], samples, name)


def _shape(shape, n: int) -> None:
    """None, or every Shape field a positive integer (a bounded one: FLOP counts use floats)."""
    if shape is None:
        return
    if not isinstance(shape, dict):
        raise RecordError(f"shape is {_short(shape)}, not an object")
    for k in SHAPE_FIELDS:
        v = shape.get(k)
        if not _is_int(v) or not (0 if k == "max_positions" else 1) <= v <= 2 ** 40:
            raise RecordError(f"shape.{k} is {_short(v)}, not a size")
    if shape["n_layers"] != n:
        raise RecordError(f"shape.n_layers is {shape['n_layers']}, n_layers is {n}")
    windows = shape.get("windows") or []  # optional: older results have none
    if not isinstance(windows, list) or (windows and len(windows) != n) or not all(
            w is None or (_is_int(w) and 1 <= w <= 2 ** 40) for w in windows):
        raise RecordError(f"shape.windows is {_short(windows)}, not a window (or null) per layer")
    for k in ("qk_norm", "branch_norms"):
        if not isinstance(shape.get(k, False), bool):
            raise RecordError(f"shape.{k} is {_short(shape.get(k))}, not true or false")


def _drift(d: dict, n_layers: int | None, expect: dict) -> None:
    n = _layers(d, n_layers)
    _layer_ids(d["skip_layers"], n, "skip_layers")
    if d["prompt_tokens"] < 2 or d.get("n_prompts", 1) < 1:
        raise RecordError("prompt_tokens must be >= 2 and n_prompts >= 1")
    steps = len(d["kl"])
    _length(d["top1_agree"], steps, "top1_agree")
    width = None
    for q in DRIFT_QUANTITIES:
        _length(d[f"{q}_cos"], n, f"{q}_cos")
        _length(d[f"{q}_min"], n, f"{q}_min")
        if q == "attn_out":
            _matrix(d[f"{q}_tok"], n, steps, f"{q}_tok")
        else:
            width = _matrix(d[f"{q}_tok"], n, width, f"{q}_tok")
    for name in ("tokens", "token_positions"):
        if d.get(name):
            _length(d[name], width, name)
    quantiles = d.get("quantiles", {})
    for q, per in quantiles.items():
        if not isinstance(per, dict):
            raise RecordError(f"quantiles.{q} is {_short(per)}, not an object")
        for p, row in per.items():
            numbers(row, f"quantiles.{q}.{p}", True)
            _length(row, n, f"quantiles.{q}.{p}")


def _sweep(d: dict, n_layers: int | None, expect: dict) -> None:

    if not d["rows"]:
        raise RecordError("rows is empty")
    for i, row in enumerate(d["rows"]):
        if not isinstance(row, dict):
            raise RecordError(f"rows[{i}] is {_short(row)}, not an object")
        check_fields(SweepRow, row, NAN_AS_NULL["sweep_row"], where=f"rows[{i}].")
        if n_layers is not None:
            _layer_ids(row["skip_layers"], n_layers, f"rows[{i}].skip_layers")


DRIFT_ROW_NUMBERS = ("hidden_cos", "k_cos", "v_cos", "attn_out_cos", "kl", "top1_agree", "v_min")


def _drift_by_length(d: dict, n_layers: int | None, expect: dict) -> None:
    rows = d.get("rows")
    if not isinstance(rows, list) or not rows:
        raise RecordError(f"rows is {_short(rows)}, not a list of rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not _is_int(row.get("length")) or row["length"] < 2:
            raise RecordError(f"rows[{i}] is not an object with a length >= 2")
        numbers([row.get(k) for k in DRIFT_ROW_NUMBERS], f"rows[{i}]", True)
        if not isinstance(row.get("text_source"), str) or type(row.get("repeated")) is not bool:
            raise RecordError(f"rows[{i}] lacks its text_source or repeated flag")
    lengths = [row["length"] for row in rows]
    if "lengths" in expect and lengths != list(expect["lengths"]):
        raise RecordError(f"the rows are for lengths {_short(lengths)}, expected "
                          f"{_short(expect['lengths'])}")


STEP_PARTS = ("attention", "ffn", "kv")  # a step-through step's grid: positions per layer
STEP_NUMBERS = ("flops", "time_ms", "start_ms")


def _stepthrough(d: dict, n_layers: int | None, expect: dict) -> None:
    n = _layers(d, n_layers)
    _layer_ids(d["skip_layers"], n, "skip_layers")
    n_tok = len(d["prompt_ids"])
    _length(d["tokens"], n_tok, "tokens")
    if not 1 <= n_tok <= 64 or not d["steps"]:
        raise RecordError(f"a step-through holds 1..64 prompt tokens and some steps, not {n_tok}")
    for run, lengths in d["cache_lengths"].items():
        _ints(lengths, f"cache_lengths.{run}", 0, 10_000)
        _length(lengths, n, f"cache_lengths.{run}")
    for j, step in enumerate(d["steps"]):
        _step(step, n, f"steps[{j}]")
    numbers([d["ttft"].get(k) for k in ("full_ms", "pop_ms", "speedup")], "ttft")


def _step(step, n: int, where: str) -> None:
    if not isinstance(step, dict) or step.get("run") not in ("full", "pop") or \
            not isinstance(step.get("stage"), str):
        raise RecordError(f"{where} is not a step of the full or the pop run")
    for part in STEP_PARTS:
        grid = step.get(part)
        if not isinstance(grid, list) or len(grid) != n:
            raise RecordError(f"{where}.{part} is not a list of positions per layer")
        for i, pos in enumerate(grid):
            _ints(pos, f"{where}.{part}[{i}]", 0, 10_000)
    calls = step.get("calls")
    if not isinstance(calls, dict) or not calls:
        raise RecordError(f"{where}.calls is {_short(calls)}, not the step's call counts")
    for kind, per_layer in calls.items():
        _ints(per_layer, f"{where}.calls.{kind}", 0, 10 ** 6)
        _length(per_layer, n, f"{where}.calls.{kind}")
    numbers([step.get(k) for k in STEP_NUMBERS], where)
    numbers(step.get("times_ms"), f"{where}.times_ms")
    for name, width in (("token", 2), ("top", None)):
        v = step.get(name)
        rows = [v] if name == "token" and v is not None else v or []
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) in ((2,) if width else (3,)) and _is_int(r[0])
                and isinstance(r[1], str) for r in rows):
            raise RecordError(f"{where}.{name} is {_short(v)}, not token ids with their text")
        if name == "top":
            numbers([r[2] for r in rows], f"{where}.top")


def _ints(xs, where: str, lo: int, hi: int) -> None:
    if not isinstance(xs, list) or not all(_is_int(x) and lo <= x <= hi for x in xs):
        raise RecordError(f"{where} is {_short(xs)}, not integers in {lo}..{hi}")


def _generation(d: dict, n_layers: int | None, expect: dict) -> None:
    _ints(d["prompt_ids"], "prompt_ids", 0, 2 ** 40)
    _ints(d["skip_layers"], "skip_layers", 0, 2 ** 20)
    for side in ("full", "other"):
        run = d[side]
        if not isinstance(run, dict):
            raise RecordError(f"{side} is {_short(run)}, not a run")
        _ints(run.get("token_ids"), f"{side}.token_ids", 0, 2 ** 40)
        numbers(run.get("times"), f"{side}.times")
        _length(run["times"], len(run["token_ids"]), f"{side}.times")
        counts = run.get("counts")
        if not isinstance(counts, dict):
            raise RecordError(f"{side}.counts is {_short(counts)}, not counts by stage")
        for stage, kinds in counts.items():
            for kind, per_layer in (kinds.items() if isinstance(kinds, dict) else [(None, None)]):
                _ints(per_layer, f"{side}.counts.{stage}.{kind}", 0, 10 ** 6)
                if n_layers is not None:
                    _length(per_layer, n_layers, f"{side}.counts.{stage}.{kind}")


def _heal_drift(d: dict, n_layers: int | None, expect: dict) -> None:
    steps = len(d["tokens_out"])
    if steps < 1:
        raise RecordError("tokens_out is empty: no step was recorded")
    _ints(d["tokens_out"], "tokens_out", 1, 10 ** 6)
    _ints(d["healed"], "healed", 0, 10 ** 7)
    _length(d["healed"], steps, "healed")
    width = n_layers
    for q in ("k", "v"):
        width = _matrix(d[q], steps, width, q)
    _layer_ids(d["skip_layers"], width, "skip_layers")


_SHAPES = {"calibration": _calibration, "drift": _drift, "sweep": _sweep,
           "drift_by_length": _drift_by_length, "stepthrough": _stepthrough,
           "generation": _generation, "heal_drift": _heal_drift}


def _short(v, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."
