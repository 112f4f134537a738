"""Lists of whole numbers written as ranges, '20-29' or '3,5,7-9' (pure: no vLLM, no torch).

The one reader of every such list both sides take from a user: skip sets (layers) and core lists
(the cores an engine is pinned to). Every number is checked against the bound before any range is
expanded, so '0-999999999999' fails at once in one line instead of building a list of 10^12.
"""
from __future__ import annotations

from .errors import InputError

MAX_DIGITS = 9  # a longer number reads as 10**9, which every bound here refuses


class RangeError(InputError):
    """A list that cannot be read; the message is one line."""


def shown(value, limit: int = 60) -> str:
    """repr() of user input for an error line, cut to `limit` characters (input can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def parse_ranges(text: str, bound: int, noun: str = "layer", limit: str | None = None,
                 example: str = "20-29", beyond=None) -> tuple[int, ...]:
    """'20-29' or '3,5,7-9' -> (3, 5, 7, 8, 9): sorted, unique, each in 0..bound-1. Empty text is
    the empty set. `limit` says where the numbers stop (default: "{noun} numbers stop at ...");
    `beyond(first, last)`, when given, words the refusal of the numbers first..last past it."""
    if not isinstance(text, str):
        raise RangeError(f"a {noun} list must be text like {example}, got {shown(text)}")
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, hi = _ends(part, text, noun, example)
        if hi < lo:
            raise RangeError(f"bad {noun} range {shown(part)}: end before start")
        if hi >= bound:
            if beyond is not None:
                raise RangeError(beyond(max(lo, bound), hi))
            where = limit or f"{noun} numbers stop at {bound - 1}"
            raise RangeError(f"{noun}(s) in {shown(part)} out of range: {where}")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def _ends(part: str, text: str, noun: str, example: str) -> tuple[int, int]:
    """'7' -> (7, 7), '7-9' -> (7, 9); digits only (no signs). Over MAX_DIGITS digits reads as
    10**9, so a 5000-digit number never becomes an int."""
    ends = [x.strip() for x in part.split("-", 1)]
    if not all(x.isascii() and x.isdigit() for x in ends):
        what = "" if part == text.strip() else f": {shown(part)}"
        raise RangeError(f"bad {noun} list {shown(text)}{what} is not a number or a range like "
                         f"{example}")
    lo, hi = (int(x) if len(x) <= MAX_DIGITS else 10 ** MAX_DIGITS for x in (ends[0], ends[-1]))
    return lo, hi
