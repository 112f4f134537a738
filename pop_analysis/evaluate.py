"""Quality metrics with POP semantics: the context goes through the variant's prefill, everything
after it through the full model (minus the decode-time drops of the static variant).

Token-level functions (`score_continuations`, `greedy_tokens`, `agreement`, `choose`) are the
core; `EvalItem` sets built from GSM8K, WizardLM-style prompt files or the synthetic retrieval
task (retrieval.py) feed them; `evaluate_items` turns a set into one summary per variant.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import first_line
from .generate import SamplingConfig, encode, run
from .models import LoadedModel
from .paths import REPO_ROOT
from .pop import check_prompt, check_variant, decode_drop, run_prompt, teacher_force


class EvalDataError(ValueError):
    """An evaluation data set or task file that cannot be used; the message names the file."""


# ---------------------------------------------------------------- token-level metrics


@dataclass
class ContinuationScore:
    """Per-token log-probabilities of a known continuation under one variant."""

    token_ids: list[int]  # the continuation scored
    logprobs: list[float]  # log p(token_t | prompt, tokens_<t)
    argmax: list[int]  # the variant's greedy choice at each position (teacher-forced)

    @property
    def nll(self) -> float:
        """Mean per-token negative log-likelihood."""
        return -sum(self.logprobs) / len(self.logprobs)

    @property
    def total_logprob(self) -> float:
        return float(sum(self.logprobs))

    @property
    def is_greedy(self) -> bool:
        """True when greedy decoding would have produced exactly this continuation."""
        return self.argmax == self.token_ids


@torch.inference_mode()
def score_continuations(lm: LoadedModel, prompt_ids, continuations, variant: str = "pop",
                        skip=()) -> list[ContinuationScore]:
    """Score several continuations of one prompt, sharing one (pruned) prefill.

    The prompt runs through `run_prompt` (the variant's prefill + boundary step); each
    continuation is then teacher-forced in one chunk through the full model (static: minus skip).
    """
    check_variant(variant)
    conts = [list(c) for c in continuations]
    if not conts or any(len(c) == 0 for c in conts):
        raise EvalDataError("every continuation to score needs at least one token")
    adapter = lm.adapter
    check_prompt(adapter, len(prompt_ids), max(len(c) for c in conts))
    ids = torch.tensor([list(prompt_ids)], device=adapter.device)  # (1, N)
    first = run_prompt(adapter, ids, variant, skip)
    first_lp = torch.log_softmax(first.logits[0], -1)  # (V,)
    drop = decode_drop(variant, skip)
    out = []
    for j, cont in enumerate(conts):
        # teacher_force appends to the cache: later continuations need an untouched copy.
        cache = first.cache if j == len(conts) - 1 else copy.deepcopy(first.cache)
        lp = first_lp[None]  # (1, V)
        if len(cont) > 1:
            fed = torch.tensor([cont[:-1]], device=adapter.device)  # (1, M-1)
            logits = teacher_force(adapter, fed, cache, first.position, drop)  # (1, M-1, V)
            lp = torch.cat([lp, torch.log_softmax(logits[0], -1)])  # (M, V)
        target = torch.tensor(cont, device=lp.device)  # (M,)
        tok_lp = lp.gather(1, target[:, None])[:, 0]  # (M,)
        out.append(ContinuationScore(cont, tok_lp.tolist(), lp.argmax(-1).tolist()))
    return out


def continuation_nll(lm: LoadedModel, prompt_ids, continuation, variant: str = "pop",
                     skip=()) -> float:
    """Mean per-token NLL of `continuation` given `prompt_ids` under one variant."""
    return score_continuations(lm, prompt_ids, [continuation], variant, skip)[0].nll


def greedy_tokens(lm: LoadedModel, prompt_ids, variant: str = "pop", skip=(),
                  max_new_tokens: int = 32, stop_at_eos: bool = True) -> list[int]:
    """The variant's greedy continuation (POP generation: pruned prefill, full decode)."""
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_eos=stop_at_eos)
    return run(lm, list(prompt_ids), variant, skip, cfg).token_ids


@dataclass(frozen=True)
class Agreement:
    """How a variant's greedy tokens compare with the full model's."""

    match_rate: float  # position-wise matches / the longer length (1.0 when identical)
    first_divergence: int | None  # first index that differs; None when identical
    exact: bool  # identical sequences


def agreement(reference, output) -> Agreement:
    ref, out = list(reference), list(output)
    if ref == out:
        return Agreement(1.0, None, True)
    matches = sum(a == b for a, b in zip(ref, out))
    first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    return Agreement(matches / max(len(ref), len(out)), first, False)


def choose(lm: LoadedModel, context_ids, choices, variant: str = "pop", skip=(),
           length_normalise: bool = False) -> tuple[int, list[float]]:
    """Multiple choice by log-likelihood: (index of the best choice, score of each choice).

    Scores are summed log-probabilities (or per-token means when `length_normalise`).
    """
    scored = score_continuations(lm, context_ids, choices, variant, skip)
    vals = [s.total_logprob / (len(s.token_ids) if length_normalise else 1) for s in scored]
    return max(range(len(vals)), key=vals.__getitem__), vals


# ---------------------------------------------------------------- answers (GSM8K, retrieval)

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


# ---------------------------------------------------------------- evaluation items


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
    name: str  # what the user asked for
    fingerprint: str  # sha256 of the items' token ids and answers
    items: tuple[EvalItem, ...]
    kind: str = "prompts"  # "gsm8k" | "prompts" | "retrieval": which answer metric applies


def fingerprint(items) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([list(it.prompt_ids), list(it.reference_ids), it.answer]).encode())
    return h.hexdigest()


def data_dir() -> Path:
    """Where named data sets live: $POP_LAB_DATA, else ../shared/data beside the repository."""
    return Path(os.environ.get("POP_LAB_DATA") or REPO_ROOT.parent / "shared" / "data")


NAMED = {"gsm8k": "gsm8k_test.jsonl", "gsm8k_train": "gsm8k_train.jsonl",
         "wizardlm": "wizardlm_testset.jsonl", "selfinstruct": "selfinstruct_seed_tasks.jsonl"}
PROMPT_FIELDS = ("question", "prompt", "instruction", "Instruction", "input", "text")
REFERENCE_FIELDS = ("answer", "response", "output", "completion", "target")


def read_records(path: Path) -> list[dict]:
    """Records of a .jsonl / .json / .txt file; errors name the file and line."""
    if not path.is_file():
        raise EvalDataError(f"data file not found: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".txt":
        return [{"prompt": line} for line in text.splitlines() if line.strip()]
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise EvalDataError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise EvalDataError(f"{path}: expected a JSON list of objects")
        return data
    if path.suffix != ".jsonl":
        raise EvalDataError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .txt")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise EvalDataError(f"{path} line {n}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise EvalDataError(f"{path} line {n}: expected a JSON object")
        out.append(rec)
    return out


def _pick(rec: dict, fields) -> str | None:
    for f in fields:
        if isinstance(rec.get(f), str) and rec[f].strip():
            return rec[f]
    return None


def records_to_items(lm: LoadedModel, records, source: str, raw: bool = False) -> list[EvalItem]:
    """Prompt (+ reference) records -> tokenised items. GSM8K answers also give a gold number."""
    if lm.tokenizer is None:
        raise EvalDataError(f"model {lm.name} has no tokenizer: text data sets need one")
    items = []
    for n, rec in enumerate(records, 1):
        prompt = _pick(rec, PROMPT_FIELDS)
        if prompt is None:
            raise EvalDataError(f"{source} record {n}: no prompt field (one of {', '.join(PROMPT_FIELDS)})")
        ref = _pick(rec, REFERENCE_FIELDS)
        gold = gsm8k_gold(ref) if ref and "####" in ref else None
        ref_ids = tuple(lm.tokenizer(ref, add_special_tokens=False)["input_ids"]) if ref else ()
        items.append(EvalItem(tuple(encode(lm, prompt, raw)), ref_ids, gold, prompt))
    return items


def load_eval_set(lm: LoadedModel, source: str, limit: int | None = None, raw: bool = False,
                  seed: int = 0) -> EvalSet:
    """An evaluation set from a name (gsm8k, wizardlm, selfinstruct, retrieval[:LENGTH],
    builtin), a local .jsonl/.json/.txt file, or hf:NAME[:split] (needs the network)."""
    if limit is not None and limit < 1:
        raise EvalDataError(f"the sample count must be positive, got {limit}")
    kind = "prompts"
    if source == "retrieval" or source.startswith("retrieval:"):
        from .retrieval import RetrievalConfig, retrieval_items

        length = int(source.split(":", 1)[1]) if ":" in source else 512
        items = retrieval_items(lm, RetrievalConfig(n_items=limit or 8, length=length, seed=seed))
        return EvalSet(source, fingerprint(items), tuple(items), "retrieval")
    if source == "builtin":
        from .data import load_prompts  # the calibration prompt sets

        records = [{"prompt": p} for p in load_prompts("builtin", limit=limit).prompts]
    elif source.startswith("hf:"):
        records = _hf_records(source)
    else:
        path = data_dir() / NAMED[source] if source in NAMED else Path(os.path.expanduser(source))
        if source not in NAMED and not path.suffix:
            raise EvalDataError(f"unknown data set {source!r}: give one of {', '.join(NAMED)}, "
                                "retrieval[:LENGTH], builtin, hf:NAME or a .jsonl/.json/.txt file")
        records = read_records(path)
    records = records[:limit] if limit else records
    if not records:
        raise EvalDataError(f"data set {source!r} holds no records")
    items = records_to_items(lm, records, source, raw)
    if any(it.answer is not None for it in items):
        kind = "gsm8k"
    return EvalSet(source, fingerprint(items), tuple(items), kind)


def _hf_records(source: str) -> list[dict]:
    name, _, split = source[3:].partition(":")
    try:
        import datasets

        ds = datasets.load_dataset(name, "main" if name.endswith("gsm8k") else None,
                                   split=split or "test")
    except Exception as e:  # noqa: BLE001 - offline or unknown: one line
        raise EvalDataError(f"cannot load {source} from the hub: {first_line(e)}") from None
    return [dict(r) for r in ds]


# ---------------------------------------------------------------- summaries over a set


@dataclass
class EvalSummary:
    """One variant over one set; None where a metric does not apply."""

    variant: str
    skip_layers: list[int]
    n: int  # items
    continuation_nll: float  # mean over items of the per-token NLL of the reference
    greedy_agreement: float  # mean token match rate with the full model's greedy output
    first_divergence: float | None  # mean first differing index over diverging items
    sequence_exact: float  # fraction of items whose greedy output equals the full model's
    teacher_forced_top1: float  # fraction of reference tokens that are the variant's argmax
    answer_accuracy: float | None  # exact match with the gold answer (GSM8K number, retrieval)
    outputs: list[str] = field(default_factory=list)  # decoded greedy outputs (for display)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def full_references(lm: LoadedModel, items, max_new_tokens: int, progress=None) -> list[list[int]]:
    """The full model's greedy output per item (shared by every variant's agreement)."""
    refs = []
    for it in items:
        refs.append(greedy_tokens(lm, it.prompt_ids, "full", (), max_new_tokens))
        if progress:
            progress()
    return refs


def evaluate_items(lm: LoadedModel, items, variant: str, skip, references,
                   max_new_tokens: int, step=None) -> EvalSummary:
    """All metrics of one variant over `items`; `references` from `full_references`.

    `step()` is called after each item (progress). Items without reference_ids score the full
    model's greedy output as their continuation.
    """
    nll, agree, div, exact, top1, correct, texts = [], [], [], [], [], [], []
    for it, ref in zip(items, references):
        cont = list(it.reference_ids) or ref
        score = score_continuations(lm, it.prompt_ids, [cont], variant, skip)[0]
        nll.append(score.nll)
        top1.append(sum(a == b for a, b in zip(score.argmax, cont)) / len(cont))
        out = ref if variant == "full" else greedy_tokens(lm, it.prompt_ids, variant, skip,
                                                          max_new_tokens)
        ag = agreement(ref, out)
        agree.append(ag.match_rate)
        exact.append(float(ag.exact))
        if ag.first_divergence is not None:
            div.append(ag.first_divergence)
        text = lm.tokenizer.decode(out, skip_special_tokens=True) if lm.tokenizer else ""
        texts.append(text)
        if it.answer is not None:
            first = it.meta.get("answer_rule") == "first"
            correct.append(float(answer_matches(text, it.answer, first)))
        if step:
            step()
    return EvalSummary(variant, sorted(skip), len(nll), _mean(nll), _mean(agree),
                       _mean(div) if div else None, _mean(exact), _mean(top1),
                       _mean(correct) if correct else None, texts)


def _mean(xs) -> float:
    return float(statistics.fmean(xs)) if xs else float("nan")


# ---------------------------------------------------------------- GSM8K few-shot prompts


def gsm8k_prompt(question: str, shots=()) -> str:
    """'Question: ...\\nAnswer: ...' few-shot text ending with the open question."""
    parts = [f"Question: {q}\nAnswer: {a}" for q, a in shots]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def gsm8k_shots(n: int, source: str = "gsm8k_train") -> list[tuple[str, str]]:
    """The first n (question, answer) pairs of the GSM8K train file."""
    if n <= 0:
        return []
    recs = read_records(data_dir() / NAMED[source])[:n]
    return [(r["question"], r["answer"]) for r in recs]


def gsm8k_exact_match(lm: LoadedModel, n_samples: int = 8, variant: str = "pop", skip=(),
                      n_shot: int = 0, max_new_tokens: int = 256, source: str = "gsm8k",
                      raw: bool = False) -> dict:
    """GSM8K accuracy: generate greedily with POP semantics, compare the number with '####'."""
    shots = gsm8k_shots(n_shot)
    path = data_dir() / NAMED[source] if source in NAMED else Path(source)
    recs = read_records(path)[:n_samples]
    hits, outputs = [], []
    for rec in recs:
        ids = encode(lm, gsm8k_prompt(rec["question"], shots), raw)
        toks = greedy_tokens(lm, ids, variant, skip, max_new_tokens)
        text = lm.tokenizer.decode(toks, skip_special_tokens=True)
        text = text.split("\n\nQuestion:")[0]  # stop where a few-shot model starts a new question
        outputs.append(text)
        hits.append(answer_matches(text, gsm8k_gold(rec["answer"])))
    return {"variant": variant, "skip_layers": sorted(skip), "n": len(hits), "n_shot": n_shot,
            "exact_match": _mean([float(h) for h in hits]), "outputs": outputs}
