"""Stored example results shipped with POP Lab (class mode): every page opens with a real result
of the loaded embedded model before anyone waits for a run.

Each example is a results-store entry (the same envelope: kind, key, params, saved_at, payload)
copied by `python -m pop_analysis examples` into pop_analysis/examples/<model>/<kind>.json, with
an `example` block saying what it is: model, data, machine, date, the command that made it. A
checksum file (SHA256SUMS, one `digest  path` line per file) pins every file; a file whose digest
differs, or whose envelope or payload fails the record checks, is not shown (a notice says why).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pop_analysis.errors import first_line
from pop_analysis.store.records import RecordError
from pop_analysis.store.results import KEY_PATTERN, read_entry, warn

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"  # pop_analysis/examples/
SUMS = "SHA256SUMS"
KINDS = ("calibration", "drift", "sweep", "generation", "stepthrough", "heal_drift",
         "heal_stepthrough")
# An example kind that is a store entry of another kind: the healed step-through is a step-through
# record whose POP run heals (its example file has its own name, its envelope the store's kind).
STORE_KINDS = {"heal_stepthrough": "stepthrough"}
LABEL_FIELDS = ("model", "data", "machine", "date", "command")


@dataclass(frozen=True)
class Example:
    """One shipped example: its payload (checked) and what it is."""

    kind: str
    model: str  # registry name of the model it was made with
    payload: dict
    label: dict  # LABEL_FIELDS -> text
    key: str  # its results-store key (the params hash)

    def caption(self) -> str:
        """'Stored example: smollm2-135m · 64 WizardLM prompts · <machine> · 2026-12-02'."""
        lab = self.label
        return f"Stored example: {lab['model']} · {lab['data']} · {lab['machine']} · {lab['date']}"


def store_kind(kind: str) -> str:
    """The results-store kind an example of `kind` is an entry of."""
    return STORE_KINDS.get(kind, kind)


def _heals(payload: dict) -> None:
    heal = (payload.get("config") or {}).get("heal") or {}
    if heal.get("policy", "none") == "none":
        raise RecordError("its POP run does not heal (config.heal)")


REQUIRES = {"heal_stepthrough": _heals}  # what an example kind asks beyond its store kind's check


def example_path(model: str, kind: str, root: Path | None = None) -> Path:
    return (root or EXAMPLES_DIR) / model / f"{kind}.json"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def checksums(root: Path | None = None) -> dict[str, str]:
    """{relative path: sha256} from the checksum file ({} when there is none)."""
    path = (root or EXAMPLES_DIR) / SUMS
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            value, name = line.split(maxsplit=1)
            out[name.strip()] = value
    return out


def write_checksums(root: Path | None = None) -> Path:
    """Rewrite the checksum file from the example files on disk."""
    root = root or EXAMPLES_DIR
    files = sorted(p.relative_to(root).as_posix() for p in root.glob("*/*.json"))
    (root / SUMS).write_text("".join(f"{digest(root / f)}  {f}\n" for f in files), encoding="utf-8")
    return root / SUMS


def load_example(model: str, kind: str, check=None, notice=None,
                 root: Path | None = None) -> Example | None:
    """The example of `kind` for `model`, or None when none ships or it fails a check.

    check(payload) raises ValueError for a payload the caller cannot use (records.check with the
    result class and the model's layer count); notice(line) hears why a file was not used.
    """
    root = root or EXAMPLES_DIR
    path = example_path(model, kind, root)
    if not path.is_file():
        return None
    try:
        rel = path.relative_to(root).as_posix()
        want = checksums(root).get(rel)
        if want is None or want != digest(path):
            raise RecordError("its checksum is not the one in SHA256SUMS")
        entry = json.loads(path.read_text(encoding="utf-8"))
        key, label = entry.get("key"), entry.get("example")
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise RecordError("no store key")
        if not isinstance(label, dict) or not all(isinstance(label.get(f), str) for f in LABEL_FIELDS):
            raise RecordError("no label (model, data, machine, date, command)")
        payload = read_entry(path, store_kind(kind), key)
        made_with = {label["model"], payload.get("model") if isinstance(payload, dict) else None}
        if made_with != {model}:  # a file copied into another model's folder, or mislabelled
            raise RecordError(f"it was made with {', '.join(sorted(map(str, made_with - {model})))},"
                              f" not {model}")
        if check is not None:
            check(payload)
        REQUIRES.get(kind, lambda _p: None)(payload)
        return Example(kind, model, payload, label, key)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        (notice or warn)(f"stored example {model}/{kind} not used ({first_line(e)})")
        return None


def write_example(model: str, kind: str, entry: dict, label: dict, root: Path | None = None) -> Path:
    """Copy a store entry (its whole envelope) to the examples folder with its label; the
    checksum file is rewritten."""
    missing = [f for f in LABEL_FIELDS if not isinstance(label.get(f), str)]
    if missing or entry.get("kind") != store_kind(kind):
        raise ValueError(f"an example needs a {store_kind(kind)} entry and a label with "
                         f"{', '.join(missing)}")
    path = example_path(model, kind, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**entry, "example": dict(label)}, separators=(",", ":")),
                    encoding="utf-8")
    write_checksums(root)
    return path
