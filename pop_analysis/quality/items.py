"""Evaluation items and sets: the tokenised examples that metrics, sweeps and reports consume.

A small module of its own so that data-set builders (evalsets.py, retrieval.py) and the
evaluation engine (evaluate.py) share the types without importing each other.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from pop_analysis.errors import InputError


class EvalDataError(InputError):
    """An evaluation data set or task file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class EvalItem:
    """One evaluation example, already tokenised."""

    prompt_ids: tuple[int, ...]  # the context: goes through the variant's prefill
    reference_ids: tuple[int, ...] = ()  # continuation to score; () = the full model's greedy output
    answer: str | None = None  # gold answer for exact match (a GSM8K number, a retrieval code)
    text: str = ""  # the prompt text, for display
    meta: dict = field(default_factory=dict, hash=False, compare=False)  # e.g. depth, length


@dataclass(frozen=True)
class EvalSet:
    """The items of one data set, with what the user asked for."""

    name: str  # what the user asked for
    fingerprint: str  # sha256 of the items' token ids and answers
    items: tuple[EvalItem, ...]
    kind: str = "prompts"  # "gsm8k" | "prompts" | "retrieval": which answer metric applies
    note: str = ""  # e.g. fewer items than asked for: the set holds fewer


def fingerprint(items) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([list(it.prompt_ids), list(it.reference_ids), it.answer]).encode())
    return h.hexdigest()
