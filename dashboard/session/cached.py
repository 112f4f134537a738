"""@st.cache_data wrappers: the results store first, compute on a miss.

Computations with progress bars go through the engines' own `cached_*` functions (the store is
their cache, shared with the CLI); reads of stored entries and prompt files are memoised here
so a stored result appears without touching the disk twice.
"""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from pop_analysis.data.allowed_paths import check_path, check_source
from pop_analysis.store import results as store
from pop_analysis.store.paths import cache_dir
from pop_analysis.store.records import RecordError, check


class StoredMiss(KeyError):
    """No usable stored entry for that key (never cached, so a later save is seen)."""

    def __init__(self, reason: str | None = None):
        super().__init__(reason)
        self.reason = reason  # why an existing entry was not used; None when there is none


@st.cache_data(show_spinner=False, max_entries=64)
def stored_payload(kind: str, key: str) -> dict:
    """The stored payload of (kind, key); raises StoredMiss (uncached) when absent or invalid."""
    reasons: list[str] = []
    payload = store.load(kind, key, notice=reasons.append)
    if payload is None:
        raise StoredMiss(reasons[0] if reasons else None)
    return payload


@st.cache_data(show_spinner=False, ttl=3)
def stored_entries(kind: str) -> list[dict]:
    """Store listing (key, saved_at, params), newest first; refreshed every few seconds."""
    return store.entries(kind)


def load_result(kind: str, key: str, cls, what: str = "Run it again."):
    """A stored result rebuilt with `cls.from_dict` once records.check passes it, or None when
    missing or invalid: one error here, where the user asked for it, saying why and `what` to do
    (a page adds nothing: each error is shown once)."""
    try:
        payload = stored_payload(kind, key)
        check(kind, cls, payload)
        return cls.from_dict(payload)
    except StoredMiss as e:
        reason = e.reason or f"the stored {kind} result {key} is missing"
    except RecordError as e:
        reason = f"stored {kind} result {key} not used ({e})"
    st.error(f"That entry cannot be shown: {reason}. {what}")
    return None


@st.cache_data(show_spinner=False, max_entries=32)
def _prompt_set(source: str, field: str | None, limit: int | None, stamp: float,
                label: str | None = None):
    from pop_analysis.data.prompts import load_prompts

    return load_prompts(source, field=field, limit=limit, label=label)


def upload_name(path: str) -> str | None:
    """The user's own file name of an upload kept under cache/uploads/<hash>/, else None."""
    p = Path(path)
    return p.name if p.parent.parent == cache_dir() / "uploads" else None


def prompt_set(source: str, field: str | None = None, limit: int | None = None):
    """pop_analysis.data.prompts.load_prompts, memoised per file version (mtime) and arguments; only
    files under the allowed folders (pop_analysis.data.allowed_paths)."""
    source = check_source(source)
    stamp = os.path.getmtime(source) if os.path.isfile(source) else 0.0
    return _prompt_set(source, field, limit, stamp, upload_name(source))


MAX_FIELDS = 200  # field names offered for the prompt field


@st.cache_data(show_spinner=False, max_entries=32)
def peek_fields(path: str) -> list[str]:
    """Field names of a .jsonl / .json / .csv file's first record ([] when unknown, unreadable,
    or outside the allowed folders: nothing of such a file is shown)."""
    from pop_analysis.data.prompts import READERS

    try:
        p = check_path(path)
        if p.suffix.lower() not in (".jsonl", ".json", ".csv"):
            return []
        records = READERS[p.suffix.lower()](p)
        first = next(records, (None, None))[1]  # only the first record is read
        records.close()
    except (OSError, ValueError):
        return []
    if not isinstance(first, dict):
        return []
    names = list(map(str, first)) if p.suffix.lower() == ".csv" else sorted(map(str, first))
    return names[:MAX_FIELDS]  # a record may have a million fields; a select box shows a few


# ---------- compare: stored calibrations as overlays ----------

def calibration_label(entry: dict) -> str:
    """'smollm2-135m · builtin · 8 samples · 2026-01-05 14:02' for a store entry."""
    import datetime

    p = entry.get("params") or {}
    when = datetime.datetime.fromtimestamp(entry.get("saved_at", 0)).strftime("%Y-%m-%d %H:%M")
    return f"{p.get('model', '?')} · {p.get('dataset', '?')} · {p.get('n_samples', '?')} samples · {when}"


@st.cache_data(show_spinner=False, max_entries=64)
def importance_curves(kind: str, key: str) -> tuple[list[float], list[float]] | None:
    """(prefill, decode) importance of a stored calibration; None when missing or unreadable.
    Only the two curves are memoised, so an overlay costs a small copy, not a payload."""
    try:
        payload = stored_payload(kind, key)
        return [float(v) for v in payload["prefill"]], [float(v) for v in payload["decode"]]
    except (StoredMiss, KeyError, TypeError, ValueError):
        return None


def calibration_overlays(keys, labels: dict) -> list[dict]:
    """The chosen stored calibrations as chart overlays ({label, prefill, decode})."""
    from pop_analysis.importance.calibrate import KIND

    out = []
    for key in keys:
        curves = importance_curves(KIND, key) if key in labels else None
        if curves is not None:
            out.append({"label": labels[key], "prefill": curves[0], "decode": curves[1]})
    return out


@st.cache_data(show_spinner=False, max_entries=64)
def sweep_rows(key: str) -> tuple[str, list[dict]] | None:
    """(kind, rows) of a stored sweep; None when missing or unreadable."""
    try:
        payload = stored_payload("sweep", key)
        return str(payload["kind"]), list(payload["rows"])
    except (StoredMiss, KeyError, TypeError):
        return None


def sweep_overlays(keys, kind: str, labels: dict) -> list[dict]:
    """The chosen stored sweeps of `kind` as chart overlays ({label, rows}); others left out."""
    out = []
    for key in keys:
        got = sweep_rows(key) if key in labels else None
        if got is not None and got[0] == kind:
            out.append({"label": labels[key], "rows": got[1]})
    return out
