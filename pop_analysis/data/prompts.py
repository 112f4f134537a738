"""Prompt sets for calibration and evaluation: built-in, local files, Hugging Face datasets.

`load_prompts(source)` takes "builtin", a local .jsonl/.json/.csv/.parquet/.txt file, or
"hf:NAME[:split]" / "hf:NAME:config:split" (the hub's Parquet export, read by the same bounded
reader as a local Parquet file; needs a network). The prompt field is
detected (instruction, question, prompt, text, then chat messages/conversations,
case-insensitive) or named explicitly.
A bad file gets a DatasetError naming the file and the line (item, row); an empty set is refused.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pop_analysis.data.hub_data import hub_records, parse_source
from pop_analysis.data.readers import (DatasetError, csv_records, json_records, jsonl_records,
    parquet_records, txt_records)
from pop_analysis.engine.hub import unreachable_reason
from pop_analysis.errors import first_line, listed

BUILTIN_NAME = "builtin"
FIELDS = ("instruction", "question", "prompt", "text")  # detection order
CHAT_FIELDS = ("messages", "conversations")
HF_DEFAULT_LIMIT = 1000  # rows streamed from a hub dataset when no limit is given
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")


@dataclass(frozen=True)
class PromptOrigin:
    """Where prompts handed over as token ids came from, as a stored result records it."""

    dataset: str = "token ids"  # the set's name ("builtin", a file, "hf:NAME:split")
    fingerprint: str = ""  # of the prompts used (empty: not known)


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
    """The first `limit` prompts; fewer than `limit` is refused, saying how many there are (a
    silent clamp would hide it)."""
    prompts = tuple(prompts)[:limit] if limit is not None else tuple(prompts)
    if not prompts:
        raise DatasetError(f"{where or name}: no prompts found (an empty set cannot calibrate)")
    if limit is not None and len(prompts) < limit:
        raise DatasetError(f"{where or name} holds {len(prompts)} prompts, fewer than the {limit} "
                           f"asked for; ask for at most {len(prompts)}")
    return PromptSet(name=name, fingerprint=fingerprint(prompts), prompts=prompts)


def load_prompts(source: str, field: str | None = None, limit: int | None = None,
                 label: str | None = None) -> PromptSet:
    """A PromptSet from "builtin", a local file or "hf:NAME[:split]"; the first `limit` prompts.

    Files are read only as far as the first `limit` prompts. `label` names the file in errors
    and in the set's name (an uploaded file's own name rather than where it was saved).
    """
    if limit is not None and limit < 1:
        raise DatasetError(f"limit must be at least 1, got {limit}")
    source = (source or "").strip()
    if source == BUILTIN_NAME:
        from pop_analysis.data.builtin_prompts import PROMPTS

        return make_set(BUILTIN_NAME, PROMPTS, limit)
    if source.startswith("hf:"):
        return _load_hf(source, field, limit)
    return load_file(Path(source).expanduser(), field, limit, label)


READERS = {".jsonl": jsonl_records, ".json": json_records, ".csv": csv_records,
           ".parquet": parquet_records, ".txt": txt_records}


def load_file(path: Path, field: str | None = None, limit: int | None = None,
              label: str | None = None) -> PromptSet:
    name = label or str(path)
    if not path.is_file():
        raise DatasetError(f"{name}: no such file (give 'builtin', a file path or hf:NAME)")
    suffix = path.suffix.lower()
    if suffix not in READERS:
        raise DatasetError(f"{name}: unsupported file type {suffix or '(none)'}; "
                           f"use one of {', '.join(SUFFIXES)}")
    if suffix == ".parquet":  # the prompt's columns alone, chosen from the schema
        records = parquet_records(path, name, lambda names: prompt_columns(names, field, name))
    else:
        records = READERS[suffix](path, name)
    try:
        prompts = _prompts(records, name, field, limit)
    finally:
        records.close()  # stop reading (closes the file) when the limit came first
    return make_set(Path(label).name if label else path.name, prompts, limit, where=name)


# --- field detection -----------------------------------------------------------------------------

def _prompts(records, path, field: str | None, limit: int | None) -> list[str]:
    out: list[str] = []
    chosen = field
    for where, rec in records:
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
        if limit is not None and len(out) >= limit:
            break  # the reader is not asked for another record
    return out


def prompt_columns(names, field: str | None, where: str) -> list[str]:
    """The columns of a table that hold its prompts: `field` (or the detected one), with the
    input column of instruction + input records."""
    if field is not None and field not in names:
        raise DatasetError(f"{where}: field {field!r} missing (fields: {listed(names)})")
    chosen = field if field is not None else detect_field(dict.fromkeys(names), where)
    extra = [n for n in names if n == "input"] if str(chosen).lower() == "instruction" else []
    return [chosen, *extra]


def detect_field(rec: dict, where: str) -> str:
    """The record's prompt field: the first of FIELDS, then CHAT_FIELDS, case-insensitive."""
    lower = {str(k).lower(): k for k in rec}
    for name in FIELDS + CHAT_FIELDS:
        if name in lower:
            return lower[name]
    raise DatasetError(f"{where}: no prompt field found among {listed(rec)}; expected "
                       f"one of {', '.join(FIELDS + CHAT_FIELDS)} or name it with --field")


def _text_of(rec: dict, field: str, where: str) -> str:
    if field not in rec:
        raise DatasetError(f"{where}: field {field!r} missing (fields: {listed(rec)})")
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
    name, config, split = parse_source(source)
    label = f"hf:{name}:{config}:{split}" if config else f"hf:{name}:{split}"
    reason = unreachable_reason()  # before any request (retries take half a minute offline)
    if reason is not None:
        raise DatasetError(f"{source}: cannot stream the dataset: the hub is out of reach "
                           f"({reason})")
    records = hub_records(source, lambda names: prompt_columns(names, field, label))
    try:
        prompts = _prompts(records, label, field, limit or HF_DEFAULT_LIMIT)
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 - offline, unknown name, bad split: all one message
        raise DatasetError(f"{source}: cannot stream the dataset (is the network reachable?): "
                           f"{first_line(e)}") from None
    finally:
        records.close()
    return make_set(label, prompts, limit)
