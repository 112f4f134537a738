"""Prompt sets for calibration and evaluation: built-in, local files, Hugging Face datasets.

`load_prompts(source)` takes "builtin", a local .jsonl/.json/.csv/.parquet/.txt file, or
"hf:NAME[:split]" / "hf:NAME:config:split" (streamed; needs a network). The prompt field is
detected (instruction, question, prompt, text, then chat messages/conversations,
case-insensitive) or named explicitly.
A bad file gets a DatasetError naming the file and the line (item, row); an empty set is refused.
"""
from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import first_line

BUILTIN_NAME = "builtin"
FIELDS = ("instruction", "question", "prompt", "text")  # detection order
CHAT_FIELDS = ("messages", "conversations")
HF_DEFAULT_LIMIT = 1000  # rows streamed from a hub dataset when no limit is given
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")


class DatasetError(ValueError):
    """A prompt source that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class PromptSet:
    """An ordered set of prompt texts and a fingerprint of them (for cache keys)."""

    name: str  # "builtin", the file name, or "hf:NAME:split"
    fingerprint: str  # sha256 of the prompt texts
    prompts: tuple[str, ...]  # the prompts, in file order

    def __len__(self) -> int:
        return len(self.prompts)


def fingerprint(prompts) -> str:
    return hashlib.sha256(json.dumps(list(prompts)).encode("utf-8")).hexdigest()


def make_set(name: str, prompts, limit: int | None = None, where: str | None = None) -> PromptSet:
    prompts = tuple(prompts)[:limit] if limit is not None else tuple(prompts)
    if not prompts:
        raise DatasetError(f"{where or name}: no prompts found (an empty set cannot calibrate)")
    return PromptSet(name=name, fingerprint=fingerprint(prompts), prompts=prompts)


def load_prompts(source: str, field: str | None = None, limit: int | None = None) -> PromptSet:
    """A PromptSet from "builtin", a local file or "hf:NAME[:split]"; the first `limit` prompts."""
    if limit is not None and limit < 1:
        raise DatasetError(f"limit must be at least 1, got {limit}")
    source = (source or "").strip()
    if source == BUILTIN_NAME:
        from .builtin_prompts import PROMPTS

        return make_set(BUILTIN_NAME, PROMPTS, limit)
    if source.startswith("hf:"):
        return _load_hf(source, field, limit)
    return load_file(Path(source).expanduser(), field, limit)


def load_file(path: Path, field: str | None = None, limit: int | None = None) -> PromptSet:
    if not path.is_file():
        raise DatasetError(f"{path}: no such file (give 'builtin', a file path or hf:NAME)")
    suffix = path.suffix.lower()
    readers = {".jsonl": jsonl_records, ".json": _json_records, ".csv": _csv_records,
               ".parquet": _parquet_records}
    if suffix == ".txt":
        prompts = _txt_prompts(path, limit)
    elif suffix in readers:
        prompts = _prompts(readers[suffix](path), path, field, limit)
    else:
        raise DatasetError(f"{path}: unsupported file type {suffix or '(none)'}; "
                           f"use one of {', '.join(SUFFIXES)}")
    return make_set(path.name, prompts, limit, where=str(path))


# --- readers: each yields (where, record) with `where` like "line 7" -----------------------------

def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror})") from None


def jsonl_records(path: Path):
    """(where, record) per non-empty line of a JSONL file; bad JSON names the file and line."""
    for n, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} line {n}: invalid JSON ({e.msg})") from None


def _json_records(path: Path):
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path} line {e.lineno}: invalid JSON ({e.msg})") from None
    if isinstance(data, dict):  # {"data": [...]} and similar wrappers
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise DatasetError(f"{path} line 1: expected a list of records, or an object holding "
                               "exactly one list")
        data = lists[0]
    if not isinstance(data, list):
        raise DatasetError(f"{path} line 1: expected a list of records, got {type(data).__name__}")
    for i, rec in enumerate(data, start=1):
        yield f"item {i}", rec


def _csv_records(path: Path):
    reader = csv.DictReader(_read_text(path).splitlines(keepends=True))
    if not reader.fieldnames:
        raise DatasetError(f"{path} line 1: no header row")
    try:
        for rec in reader:
            if None in rec:
                raise DatasetError(f"{path} line {reader.line_num}: more values than header "
                                   "columns")
            yield f"line {reader.line_num}", rec
    except csv.Error as e:
        raise DatasetError(f"{path} line {reader.line_num}: {e}") from None


def _parquet_records(path: Path):
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds for a damaged file
        raise DatasetError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
    for i, rec in enumerate(frame.to_dict(orient="records"), start=1):
        yield f"row {i}", rec


def _txt_prompts(path: Path, limit: int | None) -> list[str]:
    """One prompt per non-empty line."""
    lines = [ln.strip() for ln in _read_text(path).splitlines()]
    return [ln for ln in lines if ln][:limit]


# --- field detection -----------------------------------------------------------------------------

def _prompts(records, path, field: str | None, limit: int | None) -> list[str]:
    out: list[str] = []
    chosen = field
    for where, rec in records:
        if limit is not None and len(out) >= limit:
            break
        if isinstance(rec, str):
            text = rec
        elif isinstance(rec, dict):
            if chosen is None:
                chosen = detect_field(rec, f"{path} {where}")
            text = _text_of(rec, chosen, f"{path} {where}")
        else:
            raise DatasetError(f"{path} {where}: expected an object or a string, "
                               f"got {type(rec).__name__}")
        if not text.strip():
            raise DatasetError(f"{path} {where}: empty prompt in field {chosen!r}")
        out.append(text.strip())
    return out


def detect_field(rec: dict, where: str) -> str:
    """The record's prompt field: the first of FIELDS, then CHAT_FIELDS, case-insensitive."""
    lower = {str(k).lower(): k for k in rec}
    for name in FIELDS + CHAT_FIELDS:
        if name in lower:
            return lower[name]
    raise DatasetError(f"{where}: no prompt field found among {sorted(map(str, rec))}; expected "
                       f"one of {', '.join(FIELDS + CHAT_FIELDS)} or name it with --field")


def _text_of(rec: dict, field: str, where: str) -> str:
    if field not in rec:
        raise DatasetError(f"{where}: field {field!r} missing (fields: {sorted(map(str, rec))})")
    value = rec[field]
    if isinstance(value, list):
        return _first_user_turn(value, where)
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {field!r} holds {type(value).__name__}, not text")
    extra = rec.get("input")
    if str(field).lower() == "instruction" and isinstance(extra, str) and extra.strip():
        return f"{value.strip()}\n\n{extra.strip()}"  # instruction + input records (Alpaca style)
    return value


def _first_user_turn(turns: list, where: str) -> str:
    """The first user turn of a chat: {role|from: user|human, content|value: text}."""
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = str(turn.get("role", turn.get("from", ""))).lower()
        text = turn.get("content", turn.get("value"))
        if role in ("user", "human") and isinstance(text, str):
            return text
    raise DatasetError(f"{where}: chat holds no user turn with text content")


# --- Hugging Face hub ----------------------------------------------------------------------------

def _load_hf(source: str, field: str | None, limit: int | None) -> PromptSet:
    parts = [p.strip() for p in source[3:].split(":")]
    if not parts[0] or len(parts) > 3:
        raise DatasetError(f"{source}: expected hf:NAME, hf:NAME:split or hf:NAME:config:split")
    name, config = parts[0], (parts[1] or None if len(parts) == 3 else None)
    split = parts[-1] if len(parts) > 1 and parts[-1] else "train"
    try:
        import datasets

        stream = datasets.load_dataset(name, config, split=split, streaming=True)
        rows = []
        for rec in stream:
            rows.append(rec)
            if len(rows) >= (limit or HF_DEFAULT_LIMIT):
                break
    except Exception as e:  # noqa: BLE001 - offline, unknown name, bad split: all one message
        raise DatasetError(f"{source}: cannot stream the dataset (is the network reachable?): "
                           f"{first_line(e)}") from None
    records = ((f"row {i}", rec) for i, rec in enumerate(rows, start=1))
    label = f"hf:{name}:{config}:{split}" if config else f"hf:{name}:{split}"
    return make_set(label, _prompts(records, label, field, limit), limit)
