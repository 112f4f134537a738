"""Results cache under cache/results/: JSON (and safetensors for big arrays), never pickle.

An entry is addressed by (kind, key) where key = hash of the parameters that determine the result
plus the package version. Writes are atomic (temp file + rename), so an interrupted run leaves no
half entry; an unreadable entry counts as a miss and is recomputed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from . import __version__
from .paths import cache_dir


def results_dir(kind: str) -> Path:
    return cache_dir() / "results" / kind


def make_key(params: dict) -> str:
    """Stable hash of JSON-able parameters and the package version."""
    blob = json.dumps({"params": plain(params), "version": __version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load(kind: str, key: str) -> dict | None:
    """The stored payload, or None on a miss or a corrupt entry."""
    path = results_dir(kind) / f"{key}.json"
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        return entry["payload"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(kind: str, key: str, payload: dict, params: dict | None = None) -> Path:
    """Write atomically; `params` are stored beside the payload so entries can be listed."""
    folder = results_dir(kind)
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"kind": kind, "key": key, "version": __version__, "saved_at": time.time(),
             "params": plain(params or {}), "payload": plain(payload)}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, folder / f"{key}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / f"{key}.json"


def entries(kind: str) -> list[dict]:
    """All readable entries of a kind, newest first: {key, saved_at, params} (no payload)."""
    out = []
    for path in results_dir(kind).glob("*.json"):
        try:
            with open(path, encoding="utf-8") as f:
                e = json.load(f)
            out.append({"key": e["key"], "saved_at": e["saved_at"], "params": e["params"]})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda e: -e["saved_at"])


class Record:
    """Mixin for result dataclasses: a JSON-able dict out, and back in.

    from_dict ignores keys the class no longer has, so entries written by an older version load.
    """

    def to_dict(self) -> dict:
        return plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def cached(kind: str, params: dict, compute, use_cache: bool = True) -> tuple[dict, bool]:
    """(payload, was_hit): the stored result for `params`, or compute(), save and return it."""
    key = make_key(params)
    if use_cache:
        hit = load(kind, key)
        if hit is not None:
            return hit, True
    payload = compute()
    save(kind, key, payload, params)
    return payload, False


def plain(obj):
    """Dataclasses, tuples, numpy/torch scalars and arrays -> JSON-able values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, float) and obj != obj:
        return None  # NaN is not JSON
    return obj
