"""Where every bench script keeps its raw output: one new file per run, named by its parameters.

    bench/raw/<script>/<what>__<param=value,...>__<UTC start>.json

The folder is documented in docs/benchmarks.md: the raw output behind a figure in the docs is
committed there, beside the figure's command; other runs' files may be deleted. A run never
writes into a file that exists already (the file is created exclusively; two runs started in
the same second get -2, -3, ...), so no run overwrites another's (a 4-turn load test once
overwrote the 6-turn file behind a docs figure). A run that adds to its output as it goes
(after each part, each batch) rewrites its own file only.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
from pathlib import Path

RAW = Path(__file__).resolve().parent / "raw"
_UNSAFE = re.compile(r"[^A-Za-z0-9.=,+-]+")
MAX_NAME = 150  # characters of parameters in a file name; longer ones end in a digest


def params_of(args) -> dict:
    """A run's parameters: an argparse Namespace or a dict, JSON-able values only."""
    items = vars(args).items() if isinstance(args, argparse.Namespace) else dict(args).items()
    return {k: v for k, v in sorted(items) if isinstance(v, (str, int, float, bool, type(None)))
            or (isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float)) for x in v))}


def name_of(params: dict) -> str:
    """'k=v,k=v' of the parameters, safe in a file name; a digest of them all when too long."""
    text = ",".join(f"{k}={'+'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
                    for k, v in params.items())
    text = _UNSAFE.sub("-", text).strip("-") or "defaults"
    if len(text) > MAX_NAME:
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
        text = f"{text[:MAX_NAME]}~{digest}"
    return text


class RawFile:
    """One run's raw output file, created at once (never an existing one), rewritten by write()."""

    def __init__(self, script: str, args, what: str | None = None, folder: Path | None = None):
        self.params = params_of(args)
        base = (folder or RAW) / script
        base.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        stem = "__".join(x for x in (what, name_of(self.params), stamp) if x)
        for n in range(1, 1000):
            path = base / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
            try:
                with open(path, "x"):
                    break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free raw output name for {stem} in {base}")
        self.path = path

    def write(self, payload) -> Path:
        """The run's output so far, replacing only this run's own file (whole, then renamed)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        os.replace(tmp, self.path)
        return self.path


def save(script: str, args, payload, what: str | None = None, show: bool = True) -> Path:
    """Write payload to a new raw output file of this run (and print it); returns its path."""
    path = RawFile(script, args, what).write(payload)
    if show:
        print(json.dumps(payload, indent=1))
    print(f"raw output: {path}", flush=True)
    return path


def latest(folder: Path, pattern: str = "*.json") -> list[Path]:
    """The newest run's file per `what` (the part of a name before its first '__'): what a
    report built from raw outputs reads."""
    newest: dict[str, Path] = {}
    for p in sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime):
        newest[p.name.split("__")[0]] = p
    return [newest[k] for k in sorted(newest)]
