"""Gold and predicted answers as normalised strings: GSM8K numbers and retrieval codes."""
from __future__ import annotations

import re

from pop_analysis.quality.items import EvalDataError

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


def gsm8k_gold(answer_text: str) -> str:
    """The number after '####' in a GSM8K reference answer."""
    if "####" not in answer_text:
        raise EvalDataError(f"GSM8K answer has no '####' line: {answer_text[-60:]!r}")
    return normalise_number(answer_text.split("####")[-1])


def extract_answer(text: str, first: bool = False) -> str | None:
    """A model's numeric answer: the number after '####' if present, else the last number
    (the first one when `first`, as for a retrieval code)."""
    tail = text.split("####", 1)[1] if "####" in text else text
    nums = _NUMBER.findall(tail)
    if not nums:
        return None
    return normalise_number(nums[0] if first or "####" in text else nums[-1])


def normalise_number(s: str) -> str:
    s = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        x = float(s)
    except ValueError:
        return s
    return str(int(x)) if x == int(x) else str(x)


def answer_matches(generated_text: str, gold: str, first: bool = False) -> bool:
    pred = extract_answer(generated_text, first)
    return pred is not None and pred == normalise_number(gold)
