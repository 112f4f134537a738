"""Error text for people: every failure reaches a user as one readable line."""
from __future__ import annotations


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
