"""@st.cache_data wrappers: the results store first, compute on a miss.

Computations with progress bars go through the engines' own `cached_*` functions (the store is
their cache, shared with the CLI); reads of stored entries and prompt files are memoised here
so a stored result appears without touching the disk twice.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import streamlit as st

from pop_analysis import store


class StoredMiss(KeyError):
    """No readable stored entry for that key (never cached, so a later save is seen)."""


@st.cache_data(show_spinner=False, max_entries=64)
def stored_payload(kind: str, key: str) -> dict:
    """The stored payload of (kind, key); raises StoredMiss (uncached) when absent."""
    payload = store.load(kind, key)
    if payload is None:
        raise StoredMiss(f"no stored {kind} result {key}")
    return payload


@st.cache_data(show_spinner=False, ttl=3)
def stored_entries(kind: str) -> list[dict]:
    """Store listing (key, saved_at, params), newest first; refreshed every few seconds."""
    return store.entries(kind)


def load_result(kind: str, key: str, cls):
    """A stored result rebuilt with `cls.from_dict`, or None when missing or unreadable."""
    try:
        return cls.from_dict(stored_payload(kind, key))
    except (StoredMiss, TypeError, ValueError, KeyError, AttributeError):
        return None


@st.cache_data(show_spinner=False, max_entries=32)
def _prompt_set(source: str, field: str | None, limit: int | None, stamp: float):
    from pop_analysis.data import load_prompts

    return load_prompts(source, field=field, limit=limit)


def prompt_set(source: str, field: str | None = None, limit: int | None = None):
    """pop_analysis.data.load_prompts, memoised per file version (mtime) and arguments."""
    stamp = os.path.getmtime(source) if os.path.isfile(source) else 0.0
    return _prompt_set(source, field, limit, stamp)


@st.cache_data(show_spinner=False, max_entries=32)
def peek_fields(path: str) -> list[str]:
    """Field names of a .jsonl / .json / .csv file's first record ([] when unknown or unreadable)."""
    p = Path(path)
    try:
        if p.suffix == ".jsonl":
            with open(p, encoding="utf-8") as f:
                first = next((json.loads(line) for line in f if line.strip()), {})
            return sorted(first) if isinstance(first, dict) else []
        if p.suffix == ".json":
            data = json.loads(p.read_text(encoding="utf-8"))
            first = data[0] if isinstance(data, list) and data else {}
            return sorted(first) if isinstance(first, dict) else []
        if p.suffix == ".csv":
            with open(p, encoding="utf-8", newline="") as f:
                return next(csv.reader(f), [])
    except (OSError, ValueError, StopIteration):
        return []
    return []
