"""Three disjoint splits: ranking prompts, selection items, certification items.

A certified choice is only as honest as its splits: the ranking prompts order the layers, the
selection items drive the search, and the certification items are touched once, after the
search has fixed its candidate sequence. Disjointness is checked twice, before any model loads:
by where the items come from (the same file with overlapping item ranges) and by what they are
(a content fingerprint per item: its text, case and white space folded), so a copy of a file
under another name is caught too. Either overlap is refused in one line.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pop_analysis.data.prompts import BUILTIN_NAME, load_prompts
from pop_analysis.errors import InputError, shown
from pop_analysis.quality.evalsets import NAMED, PROMPT_FIELDS, data_dir, enough, records_of

ROLES = ("ranking", "selection", "certification")


class SplitError(InputError):
    """Splits that overlap, or a split that cannot be read."""


@dataclass(frozen=True)
class Split:
    """One split: where its items come from and what they are."""

    role: str  # "ranking", "selection" or "certification"
    source: str  # as the user gave it (a named set, a file, builtin)
    offset: int  # items of the source skipped first
    n: int  # items in the split
    path: str  # the resolved file ("" for built-in prompts)
    fingerprints: tuple[str, ...]  # one per item (item_fingerprint)

    @property
    def fingerprint(self) -> str:
        """One fingerprint of the whole split (its items, in order)."""
        return hashlib.sha256("".join(self.fingerprints).encode()).hexdigest()[:16]

    def label(self) -> str:
        return f"{self.role} split ({self.source} items {self.offset}-{self.offset + self.n - 1})"

    def record(self) -> dict:
        return {"role": self.role, "source": self.source, "offset": self.offset, "n": self.n,
                "fingerprint": self.fingerprint}


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def item_fingerprint(content) -> str:
    """A content fingerprint of one item: its text (case and white space folded), or its token
    ids when it has no text."""
    key = normalise(content) if isinstance(content, str) else ",".join(map(str, content))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def source_path(source: str) -> str:
    """The real file behind a source ("" for the built-in prompts)."""
    if source == BUILTIN_NAME:
        return ""
    path = data_dir() / NAMED[source] if source in NAMED else Path(os.path.expanduser(source))
    return os.path.realpath(path)


def eval_split(role: str, source: str, offset: int, n: int) -> Split:
    """Items offset..offset+n-1 of an evaluation source (read, not tokenised)."""
    if n < 1 or offset < 0:
        raise SplitError(f"the {role} split needs n >= 1 and offset >= 0, got n = {n}, "
                         f"offset = {offset}")
    records = records_of(source, offset + n)
    enough(source, len(records), offset + n, f"the {role} split (offset {offset} + {n} items)")
    texts = [next((r[f] for f in PROMPT_FIELDS if isinstance(r.get(f), str) and r[f].strip()),
                  repr(sorted(r.items()))) for r in records[offset:offset + n]]
    return Split(role, source, offset, n, source_path(source),
                 tuple(item_fingerprint(t) for t in texts))


def ranking_split(source: str, n: int, field: str | None = None) -> Split:
    """The first n prompts of a ranking source (as the importance run reads them)."""
    prompts = load_prompts(_file(source), field=field, limit=n)
    return Split("ranking", source, 0, len(prompts), source_path(source),
                 tuple(item_fingerprint(t) for t in prompts.prompts))


def _file(source: str) -> str:
    return str(data_dir() / NAMED[source]) if source in NAMED else source


def check_disjoint(splits: list[Split]) -> None:
    """Refuse, in one line, two splits that share a file range or an item's content."""
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            if a.path and a.path == b.path and a.offset < b.offset + b.n \
                    and b.offset < a.offset + a.n:
                raise SplitError(f"the {a.label()} overlaps the {b.label()}: the same file, "
                                 f"overlapping items; give disjoint offsets")
            shared = set(a.fingerprints) & set(b.fingerprints)
            if shared:
                raise SplitError(f"the {a.label()} and the {b.label()} share {len(shared)} "
                                 f"item(s) with the same text (e.g. item "
                                 f"{a.offset + a.fingerprints.index(min(shared))} of "
                                 f"{shown(a.source)}); the splits must be disjoint")


def make_splits(ranking: tuple[str, int], selection: tuple[str, int, int],
                certification: tuple[str, int, int], field: str | None = None) -> list[Split]:
    """The three splits from (source, n) and (source, offset, n) twice, checked disjoint."""
    splits = [ranking_split(*ranking, field=field), eval_split("selection", *selection),
              eval_split("certification", *certification)]
    check_disjoint(splits)
    return splits
