"""Per-item losses of many skip sets on one item pool, computed in chunks and resumable.

The raw material of everything that is regenerated from data rather than re-run: the
certification simulation (a pool of items x nested candidate sets) and the methods tables
(each method's set on the held-out items). For each chunk of items, one batched evaluation runs
every set (the full model's pass shared, the trunk below each set's lowest skipped layer reused:
quality/evaluate.py); the file is rewritten after every chunk (temp file + rename), so a run
that is stopped resumes where it stopped. Stored per item: the full model's continuation NLL and
each set's, nats per token, rounded to 1e-6; a content fingerprint per item says which items
they are.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.quality.items import EvalItem
from pop_analysis.quality.splits import item_fingerprint
from pop_analysis.store.records import RecordError, numbers
from pop_vllm.run_setting import RunSetting

KIND = "item_losses"
DIGITS = 6


class LossTableError(InputError):
    """A loss table that cannot be extended or read as asked."""


@dataclass(frozen=True)
class LossTable:
    """Per-item NLL of the full model and of each skip set over the same items."""

    model: str
    data: str  # the items' source ("gsm8k items 0-599")
    answer_tokens: int  # reference tokens scored per item
    fingerprints: tuple[str, ...]  # one per item (splits.item_fingerprint)
    sets: tuple[tuple[int, ...], ...]  # the skip sets, in the order given
    full: tuple[float, ...]  # (n,) the full model's NLL
    nll: dict  # describe(set) -> (n,) NLL, None where not yet computed

    @property
    def n(self) -> int:
        return len(self.fingerprints)

    def delta(self, skip) -> list[float]:
        """Per-item ΔNLL of one set against the full model (the paired loss); None where an item
        is not computed yet."""
        return [None if v is None or f is None else v - f
                for v, f in zip(self.nll[describe(skip)], self.full)]

    def to_dict(self) -> dict:
        return {"kind": KIND, "model": self.model, "data": self.data,
                "answer_tokens": self.answer_tokens, "fingerprints": list(self.fingerprints),
                "sets": [list(s) for s in self.sets], "full": list(self.full),
                "nll": {k: list(v) for k, v in self.nll.items()}}


def check_table(d) -> LossTable:
    """A stored loss table, checked: n fingerprints, n losses per set, a list per set."""
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise RecordError(f"not a {KIND} record")
    fps, sets, full, nll = d.get("fingerprints"), d.get("sets"), d.get("full"), d.get("nll")
    if not isinstance(fps, list) or not all(isinstance(f, str) for f in fps) or not fps:
        raise RecordError("fingerprints is not a list of strings")
    n = len(fps)
    if not isinstance(full, list) or len(full) != n:
        raise RecordError(f"full holds no loss per item ({n})")
    numbers(full, "full", nulls=True)
    if not isinstance(sets, list) or not isinstance(nll, dict) \
            or {describe(s) for s in sets} != set(nll):
        raise RecordError("nll does not hold one row per set")
    for s in sets:
        if not isinstance(s, list) or any(type(x) is not int or x < 0 for x in s):
            raise RecordError(f"set {s!r:.40} is not a list of layers")
    for k, row in nll.items():
        if not isinstance(row, list) or len(row) != n:
            raise RecordError(f"nll[{k}] holds no loss per item ({n})")
        numbers(row, f"nll[{k}]", nulls=True)
    return LossTable(d.get("model", ""), d.get("data", ""), int(d.get("answer_tokens", 0)),
                     tuple(fps), tuple(tuple(s) for s in sets), tuple(full),
                     {k: tuple(v) for k, v in nll.items()})


def load_table(path: Path) -> LossTable:
    try:
        return check_table(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as e:
        raise LossTableError(f"{path}: cannot read a loss table ({e})") from None
    except RecordError as e:
        raise LossTableError(f"{path}: {e}") from None


def complete(t: LossTable) -> bool:
    return all(v is not None for row in (t.full, *t.nll.values()) for v in row)


def compute_table(lm: LoadedModel, items: list[EvalItem], sets, path: Path, data: str,
                  answer_tokens: int, chunk: int = 40, log=print) -> LossTable:
    """Fill (or resume) the table at `path`: every set's per-item NLL, a chunk of items at a
    time; the file is rewritten after each chunk. A stored table for other items is refused."""
    sets = [tuple(sorted(s)) for s in sets]
    fps = tuple(item_fingerprint(it.text or it.prompt_ids) for it in items)
    table = _start(path, lm.name, data, answer_tokens, fps, sets)
    full, nll = list(table.full), {k: list(v) for k, v in table.nll.items()}
    t0 = time.perf_counter()
    for lo in range(0, len(items), chunk):
        idx = list(range(lo, min(lo + chunk, len(items))))
        todo = [s for s in sets if any(nll[describe(s)][i] is None for i in idx)]
        if not todo and all(full[i] is not None for i in idx):
            continue
        scores = evaluate_variants(lm, [items[i] for i in idx],
                                   [Arm(describe(s), RunSetting(s)) for s in todo],
                                   max(answer_tokens, 1), generate=False)
        for j, i in enumerate(idx):
            full[i] = round(scores[FULL.name].continuation_nll[j], DIGITS)
            for s in todo:
                nll[describe(s)][i] = round(scores[describe(s)].continuation_nll[j], DIGITS)
        table = LossTable(lm.name, data, answer_tokens, fps, tuple(sets), tuple(full),
                          {k: tuple(v) for k, v in nll.items()})
        save_table(table, path)
        log(f"{lm.name} {data}: items {idx[-1] + 1}/{len(items)}, {len(todo)} sets, "
            f"{time.perf_counter() - t0:.0f} s")
    return table


def _start(path: Path, model: str, data: str, answer_tokens: int, fps, sets) -> LossTable:
    blank = lambda: tuple([None] * len(fps))  # noqa: E731
    if not Path(path).exists():
        return LossTable(model, data, answer_tokens, fps, tuple(sets), blank(),
                         {describe(s): blank() for s in sets})
    old = load_table(path)
    if old.fingerprints != fps or old.model != model or old.answer_tokens != answer_tokens:
        raise LossTableError(f"{path} holds losses of other items or another model; remove it "
                             "or give another path")
    nll = {describe(s): old.nll.get(describe(s), blank()) for s in sets}
    return LossTable(model, data, answer_tokens, fps, tuple(sets), old.full, nll)


def save_table(t: LossTable, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(t.to_dict(), separators=(",", ":")))
    os.replace(tmp, path)
