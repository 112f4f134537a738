"""A deterministic synthetic long-context retrieval task (needle in a haystack).

Each item is a block of bland filler sentences holding a few (by default two) "pass code" facts;
one of them (the needle) sits at a chosen depth. The heading names the key wanted and the question
at the end asks for its code (asking first too lets a 135M model find early needles in 2048
tokens). The answer is a 4-digit number scored by exact match. Reading the prompt is exactly what
POP prunes, so this is where pruning the prefill is most likely to hurt, and more so as the
context grows.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pop_analysis.engine.generate import encode
from pop_analysis.engine.models import LoadedModel
from pop_analysis.quality.items import EvalItem

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "silver", "golden", "white",
           "black", "brown", "grey")
OBJECTS = ("door", "box", "lamp", "chair", "gate", "boat", "clock", "bottle", "window", "drawer",
           "bridge", "tower")
FILLER = (
    "The weather in the valley was mild for most of the year.",
    "A small river runs past the old mill and into the lake.",
    "Farmers in the region grow wheat, barley and a few apples.",
    "The library opens at nine in the morning and closes at six.",
    "Several birds were seen nesting under the roof of the barn.",
    "The road to the village is long but easy to walk.",
    "Most houses in the town are built from grey stone.",
    "On market day the square is full of stalls and voices.",
    "The school has a garden where the children plant flowers.",
    "An old map of the area hangs in the hall of the inn.",
    "The hills to the north are covered with pine trees.",
    "In winter the lake sometimes freezes near the shore.",
    "The baker starts work long before the sun comes up.",
    "A narrow path leads from the church to the cemetery.",
    "Travellers often stop at the inn to rest their horses.",
    "The museum keeps a collection of tools from past centuries.",
    "Fishermen repair their nets on the pier in the evening.",
    "The train passes through the station twice a day.",
    "A festival with music and dancing is held every summer.",
    "The council meets on the first Monday of each month.",
)
INSTRUCTION = "Notes (some give pass codes):\n\n"
ASK_FIRST = "Find the pass code for the {key} in these notes (some give pass codes):\n\n"


# Distinct needles the task draws from: a key (colour, object) and a 4-digit code. More items
# than this repeat needles: the "data" is this big, and a larger count is refused (it would also
# run for days).
RETRIEVAL_ITEMS = len(COLOURS) * len(OBJECTS) * 9000


class RetrievalError(ValueError):
    """An impossible retrieval configuration."""


@dataclass(frozen=True)
class RetrievalConfig:
    """How to build the synthetic retrieval items."""

    n_items: int = 8  # items in the set
    length: int = 512  # target prompt length in tokens (template included; ~100 at least)
    depths: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)  # needle depth, cycled over items
    distractors: int = 1  # other pass-code facts at random depths (docs/evaluation.md: the full
    #   model scores >= 0.9 at 512 tokens, >= 0.8 at 2048 with one and ask_first)
    ask_first: bool = True  # name the key before the notes too: lifts the full model at 2048 tokens
    seed: int = 0  # everything is drawn from random.Random(seed)
    raw: bool = False  # no chat template


def fact(key: str, code: str) -> str:
    return f"The pass code for the {key} is {code}."


def question(key: str) -> str:
    return f"\n\nQuestion: what is the pass code for the {key}? Answer with the four-digit code only."


def build_item_text(rng: random.Random, n_filler: int, depth: float, distractors: int,
                    ask_first: bool = False):
    """(prompt text, needle key, code): filler with the needle at `depth` of the sentences."""
    keys = rng.sample([f"{c} {o}" for c in COLOURS for o in OBJECTS], distractors + 1)
    codes = rng.sample(range(1000, 10000), distractors + 1)
    sentences = [FILLER[rng.randrange(len(FILLER))] for _ in range(n_filler)]
    for key, code in zip(keys[1:], codes[1:]):
        sentences.insert(rng.randrange(len(sentences) + 1), fact(key, str(code)))
    at = round(depth * len(sentences))
    sentences.insert(at, fact(keys[0], str(codes[0])))
    head = ASK_FIRST.format(key=keys[0]) if ask_first else INSTRUCTION
    return head + " ".join(sentences) + question(keys[0]), keys[0], str(codes[0])


def answer_prefix(key: str) -> str:
    """The start of the answer, appended after the prompt so the next tokens are the code."""
    return f"The pass code for the {key} is"


def retrieval_items(lm: LoadedModel, cfg: RetrievalConfig = RetrievalConfig()) -> list[EvalItem]:
    """Deterministic items of about cfg.length tokens; the reference continuation is the code.

    The prompt is the chat-templated notes + question followed by the answer's first words, so
    the model's next tokens are the code itself (scored by NLL and by greedy exact match).
    """
    if lm.tokenizer is None:
        raise RetrievalError(f"model {lm.name} has no tokenizer: the retrieval task is text")
    if cfg.n_items < 1 or not cfg.depths or cfg.distractors < 0:
        raise RetrievalError("retrieval needs n_items >= 1, a needle depth and distractors >= 0")
    if cfg.n_items > RETRIEVAL_ITEMS:  # before any text is built
        raise RetrievalError(f"the retrieval task holds {RETRIEVAL_ITEMS} items (distinct "
                             f"needles), fewer than the {cfg.n_items} asked for")
    if any(not 0.0 <= d <= 1.0 for d in cfg.depths):
        raise RetrievalError(f"needle depths must lie in [0, 1], got {cfg.depths}")
    limit = lm.adapter.shape.max_positions
    if limit and cfg.length > limit:  # before any text is built or tokenised
        raise RetrievalError(f"retrieval length {cfg.length} exceeds the model's context of "
                             f"{limit} tokens")
    per_sentence = _tokens_per_sentence(lm)
    base = min_length(lm, cfg)
    if cfg.length < base + per_sentence / 2:
        raise RetrievalError(f"a retrieval prompt needs at least {math.ceil(base + per_sentence / 2)} "
                             f"tokens with this model, got length {cfg.length}")
    n_filler = max(1, round((cfg.length - base) / per_sentence))
    rng = random.Random(cfg.seed)
    items = []
    for i in range(cfg.n_items):
        depth = cfg.depths[i % len(cfg.depths)]
        text, key, code = build_item_text(rng, n_filler, depth, cfg.distractors, cfg.ask_first)
        ids, ref = _encode_item(lm, text, key, code, cfg.raw)
        items.append(EvalItem(tuple(ids), tuple(ref), code, text,
                              {"depth": depth, "length": len(ids), "key": key,
                               "answer_rule": "first"}))
    return items


def min_length(lm: LoadedModel, cfg: RetrievalConfig) -> int:
    """Tokens of an item with no filler at all (template, instruction, facts, question)."""
    rng = random.Random(cfg.seed)
    text, key, code = build_item_text(rng, 0, 0.5, cfg.distractors, cfg.ask_first)
    return len(_encode_item(lm, text, key, code, cfg.raw)[0])


def _encode_item(lm: LoadedModel, text, key, code, raw) -> tuple[list[int], list[int]]:
    """(prompt ids ending with the answer prefix, code ids) split from one tokenisation."""
    prefix = answer_prefix(key)
    if raw:
        text, prefix = text + "\nAnswer: " + prefix, ""
    ids = encode(lm, text, raw)
    tok = lm.tokenizer
    head = tok(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    whole = tok(f"{prefix} {code}" if prefix else f" {code}", add_special_tokens=False)["input_ids"]
    cut = len(head)
    while cut < len(whole) - 1 and not tok.decode(whole[cut:cut + 1]).strip():
        cut += 1  # a lone space token joins the prompt: the first token to predict is a digit
    return ids + whole[:cut], whole[cut:]


def _tokens_per_sentence(lm: LoadedModel) -> float:
    n = len(lm.tokenizer(" ".join(FILLER), add_special_tokens=False)["input_ids"])
    return n / len(FILLER)


def grid_items(lm: LoadedModel, lengths, depths=RetrievalConfig.depths, per_cell: int = 10,
               seed: int = 0) -> list[EvalItem]:
    """The depth x length grid: `per_cell` items for every (length, depth); meta says which cell."""
    items = []
    for length in lengths:
        cfg = RetrievalConfig(n_items=per_cell * len(depths), length=length,
                              depths=tuple(depths), seed=seed)
        items += retrieval_items(lm, cfg)
    return items
