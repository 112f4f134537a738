"""Error text for people: every failure reaches a user as one readable line."""
from __future__ import annotations

# Input the project refuses, and how it is quoted: defined beside the run setting and the range
# reader so both sides raise and word refusals the same way.
from pop_vllm.errors import InputError  # noqa: F401
from pop_vllm.ranges import shown  # noqa: F401


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def listed(names, most: int = 12) -> str:
    """Field names for an error line: the first `most`, sorted, and how many there are (a record
    can have millions)."""
    names = sorted(map(str, names))
    if len(names) <= most:
        return str(names)
    return f"{str(names[:most])[:-1]}, ...] ({len(names)} in all)"
