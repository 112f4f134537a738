"""Results cache under cache/results/: JSON (and safetensors for big arrays), never pickle.

An entry is addressed by (kind, key) where key = hash of the parameters that determine the result
plus the package version. Writes are atomic (temp file + rename), so an interrupted run leaves no
half entry, and temp files a dead run left behind are removed by the next save. Nothing read back
is trusted: an entry counts as a miss (and is recomputed) unless its envelope names its own kind
and key and its payload passes the caller's check (records.py); a notice says why in one line.
A cache that cannot be written loses nothing but the caching: the result is returned with a
notice.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
import warnings
from pathlib import Path

from pop_analysis import __version__
from pop_analysis.errors import first_line
from pop_analysis.store.paths import cache_dir
from pop_analysis.store.records import RecordError, check
from pop_analysis.store.schema import plain

KEY_PATTERN = re.compile(r"[0-9a-f]{8,64}")  # make_key's hex digest; nothing else names a file
MAX_ENTRY_BYTES = 256 * 2 ** 20  # a larger file is not a record this code wrote
RUN_STARTED = time.time()  # temp files older than this run (less a margin) belong to a dead run
TMP_GRACE_S = 60.0  # margin for another live process that is writing right now


class StoreWarning(UserWarning):
    """A cache entry was ignored, or a result could not be stored (the default notice)."""


def warn(message: str) -> None:
    """The default notice: a warning (the CLI prints it as one `warning:` line)."""
    warnings.warn(message, StoreWarning, stacklevel=3)


def results_dir(kind: str) -> Path:
    return cache_dir() / "results" / kind


def content_sha(value) -> str:
    """sha256 of a JSON-able input (token ids, texts): a key's stand-in for a long input."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def make_key(params: dict) -> str:
    """Stable hash of JSON-able parameters and the package version."""
    blob = json.dumps({"params": plain(params), "version": __version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def entry_path(kind: str, key: str) -> Path | None:
    """The file of (kind, key), or None when `key` is not a store key (no paths from input)."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        return None
    return results_dir(kind) / f"{key}.json"


def load(kind: str, key: str, check=None, notice=None) -> dict | None:
    """The stored payload, or None on a miss.

    An entry that exists but fails its envelope or `check(payload)` (which raises ValueError) is
    a miss too; notice(line) hears why (default: a StoreWarning).
    """
    path = entry_path(kind, key)
    if path is None or not path.is_file():
        return None
    try:
        payload = _read_entry(path, kind, key)
        if check is not None:
            check(payload)
        return payload
    except (OSError, ValueError, RecursionError) as e:  # RecordError is a ValueError
        (notice or warn)(f"stored {kind} result {key} not used ({first_line(e)}); "
                         "it counts as missing")
        return None


def read_entry(path: Path, kind: str, key: str) -> dict:
    """The payload of an entry file whose envelope names `kind` and `key` (RecordError else):
    store entries and the shipped examples (store/examples.py) pass the same checks."""
    return _read_entry(path, kind, key)


def _read_entry(path: Path, kind: str, key: str) -> dict:
    if path.stat().st_size > MAX_ENTRY_BYTES:
        raise RecordError(f"the file is larger than {MAX_ENTRY_BYTES >> 20} MiB")
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
    except UnicodeDecodeError:
        raise RecordError("the file is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"not valid JSON at line {e.lineno}") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("payload"), dict):
        raise RecordError("no payload object")
    if entry.get("kind") != kind or entry.get("key") != key:
        raise RecordError(f"the entry names kind {entry.get('kind')!r:.30} and key "
                          f"{entry.get('key')!r:.30}, not those of its file")
    if not isinstance(entry.get("params"), dict) or not _finite(entry.get("saved_at")):
        raise RecordError("params or saved_at missing")
    return entry["payload"]


def load_record(kind: str, key: str, cls, n_layers: int | None = None, expect: dict | None = None,
                notice=None):
    """A stored result rebuilt as `cls` (a Record), or None when missing or invalid (with a notice).

    n_layers: the current model's layer count; expect: field values the record must hold.
    """
    payload = load(kind, key, lambda p: check(kind, cls, p, n_layers, expect), notice)
    return None if payload is None else cls.from_dict(payload)


def _finite(x) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def save(kind: str, key: str, payload: dict, params: dict | None = None) -> Path:
    """Write atomically; `params` are stored beside the payload so entries can be listed."""
    path = entry_path(kind, key)
    if path is None:
        raise ValueError(f"{key!r:.40} is not a store key (make_key makes them)")
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(folder)
    entry = {"kind": kind, "key": key, "version": __version__, "saved_at": time.time(),
             "params": plain(params or {}), "payload": plain(payload)}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_or_warn(kind: str, key: str, payload: dict, params: dict | None = None,
                 notice=None) -> Path | None:
    """save(), but a cache that cannot be written costs only the caching: a notice, no error."""
    try:
        return save(kind, key, payload, params)
    except OSError as e:
        reason = e.strerror or first_line(e)
        (notice or warn)(f"cannot store the {kind} result under {results_dir(kind)} ({reason}); "
                         "it is shown but not cached")
        return None


def remove_stale_tmp(folder: Path) -> int:
    """Delete temp files a dead run left in `folder` (older than this run); returns how many."""
    cutoff = min(RUN_STARTED, time.time()) - TMP_GRACE_S
    removed = 0
    for tmp in folder.glob(".*.tmp"):
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed += 1
        except OSError:
            continue  # another process removed or renamed it meanwhile
    return removed


def entries(kind: str) -> list[dict]:
    """All readable entries of a kind, newest first: {key, saved_at, params} (no payload).

    Only the envelope is checked here (own key, params, time); the payload is checked on load.
    """
    out = []
    for path in results_dir(kind).glob("*.json"):
        try:
            if path.stat().st_size > MAX_ENTRY_BYTES:
                continue
            with open(path, encoding="utf-8") as f:
                e = json.load(f)
            if (isinstance(e, dict) and e.get("key") == path.stem and e.get("kind") == kind
                    and isinstance(e.get("params"), dict) and _finite(e.get("saved_at"))):
                out.append({"key": e["key"], "saved_at": e["saved_at"], "params": e["params"]})
        except (OSError, ValueError, RecursionError):
            continue
    return sorted(out, key=lambda e: -e["saved_at"])




def cached(kind: str, params: dict, compute, use_cache: bool = True, check=None,
           notice=None) -> tuple[dict, bool]:
    """(payload, was_hit): the stored result for `params`, or compute(), save and return it.

    check(payload) raises ValueError for a stored payload that must not be trusted (a miss);
    notice(line) hears about ignored entries and failed writes (default: a StoreWarning).
    """
    key = make_key(params)
    if use_cache:
        hit = load(kind, key, check, notice)
        if hit is not None:
            return hit, True
    payload = compute()
    save_or_warn(kind, key, payload, params, notice)
    return payload, False

