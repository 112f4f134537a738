"""Drift against context length: block-mean drift (drift.py) for prompts of increasing length cut
from a text source (the package's builtin prompts, a .txt file, or a JSONL data set)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from pop_analysis.data.prompts import BUILTIN_NAME, jsonl_records, load_prompts
from pop_analysis.data.readers import MAX_TEXT_CHARS, read_text
from pop_analysis.inspection.drift import (
    KIND_BY_LENGTH,
    DriftConfig,
    DriftError,
    _check,
    _drift,
    _mean,
    _model_params,
    _nums,
    _variant_params,
)
from pop_analysis.progress import Cancelled, Tracker
from pop_analysis.store import results as store
from pop_analysis.store.records import check
from pop_vllm.run_setting import RunSetting

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

# Record fields whose text is joined into long prompts (GSM8K: question + answer).
TEXT_FIELDS = ("text", "question", "answer", "instruction", "Instruction", "prompt", "input",
               "output", "response")


def read_texts(source: str | None) -> tuple[list[str], str]:
    """Texts to build long prompts from, and a name for them.

    None: the package's builtin prompts (shipped, no data files needed). A .txt file is one
    text; a .jsonl file gives, per record, its text fields joined (GSM8K question + answer,
    WizardLM instruction); other files go through pop_analysis.data.prompts.load_prompts.
    """
    if source is None or source == BUILTIN_NAME:
        return list(load_prompts(BUILTIN_NAME).prompts), BUILTIN_NAME
    path = Path(source).expanduser()
    if not path.is_file():
        raise DriftError(f"text source {source} is not a file")
    if path.suffix == ".txt":
        return [read_text(path, source)], path.name  # errors name the file and line
    if path.suffix == ".jsonl":
        return _jsonl_texts(path), path.name
    return list(load_prompts(str(path)).prompts), path.name


def _jsonl_texts(path: Path) -> list[str]:
    texts, size = [], 0
    for where, rec in jsonl_records(path):
        if size >= MAX_TEXT_CHARS:
            break  # more text than any prompt of a context can use
        if not isinstance(rec, dict):
            raise DriftError(f"{path.name} {where}: expected a JSON object")
        parts = [rec[k] for k in TEXT_FIELDS if isinstance(rec.get(k), str)]
        texts.append("\n".join(parts or [v for v in rec.values() if isinstance(v, str)]))
        size += len(texts[-1])
    if not any(t.strip() for t in texts):
        raise DriftError(f"{path.name} holds no text")
    return texts


def length_prompts(lm: LoadedModel, lengths: list[int],
                   texts: list[str]) -> tuple[list[list[int]], bool]:
    """Token prompts of exactly each length, cut from the texts joined in order (raw, no chat
    template). The bool says whether the texts had to be repeated to reach the longest length."""
    tok = lm.tokenizer
    if tok is None:
        raise DriftError(f"model {lm.name} has no tokenizer: drift by length needs text")
    if not lengths or min(lengths) < 2:
        raise DriftError(f"lengths must be integers >= 2, got {lengths}")
    ids = _tokenize_prefix(tok, [t for t in texts if t.strip()], max(lengths))
    if not ids:
        raise DriftError("the text source tokenizes to nothing")
    repeated = len(ids) < max(lengths)
    while len(ids) < max(lengths):
        ids = ids + ids
    return [ids[:n] for n in lengths], repeated


def _tokenize_prefix(tok, texts: list[str], n_tokens: int) -> list[int]:
    """Tokens of the texts joined in order, at least n_tokens where the texts allow; only as
    much text as needed is tokenized (a whole data set can be hundreds of thousands of tokens)."""
    budget = 8 * n_tokens  # characters; doubled while too short
    while True:
        parts, chars = [], 0
        for t in texts:
            if chars >= budget:
                break
            parts.append(t)
            chars += len(t) + 2
        used = len(parts)
        ids = tok("\n\n".join(parts), add_special_tokens=True)["input_ids"] if parts else []
        if len(ids) >= n_tokens or used == len(texts):
            return ids
        budget *= 2


def drift_by_length(lm: LoadedModel, lengths: list[int], setting: RunSetting,
                    cfg: DriftConfig = DriftConfig(), text_source: str | None = None,
                    progress=None) -> list[dict]:
    """Block-mean drift for prompts of increasing length, one dict per length."""
    return _by_length(lm, lengths, setting, cfg, *read_texts(text_source), progress)


def _by_length(lm: LoadedModel, lengths, setting: RunSetting, cfg: DriftConfig, texts: list[str],
               name: str, progress) -> list[dict]:
    for n in lengths:  # every length is checked before any prompt is built
        _check(lm.adapter, int(n), setting, cfg)
    prompts, repeated = length_prompts(lm, list(lengths), texts)
    # A prompt step costs its prefill (weight: its tokens), a decode step about one token.
    plan = {"prompt": 2.0 * sum(lengths), "decode": 2.0 * (cfg.decode_steps - 1) * len(lengths)}
    tracker = Tracker(2 * cfg.decode_steps * len(prompts), progress, "drift by length", plan=plan)
    rows: list[dict] = []
    for n, ids in zip(lengths, prompts):
        def tick(msg, n=n):
            prompt = msg.endswith(": prompt")  # _run's message after a variant's prefill
            tracker.step(1, f"{n} tokens, {msg}", kind="prompt" if prompt else "decode",
                         weight=n if prompt else 1)
        try:
            r = _drift(lm, ids, setting, cfg, tick)
        except Cancelled as c:
            raise c.keep(rows or None)  # the lengths finished so far
        rows.append({"length": n, **r.block_means(), "kl": _mean(r.kl),
                     "top1_agree": _mean(r.top1_agree),
                     "v_min": min(_nums(r.v_min[i] for i in (r.skip_layers or range(r.n_layers))),
                                  default=float("nan")),
                     "text_source": name, "repeated": repeated})
    return rows


def cached_drift_by_length(lm: LoadedModel, lengths: list[int], setting: RunSetting,
                           cfg: DriftConfig = DriftConfig(), text_source: str | None = None,
                           use_cache: bool = True,
                           progress=None, notice=None) -> tuple[list[dict], bool]:
    """drift_by_length() through the results store, keyed by the texts' fingerprint."""
    texts, name = read_texts(text_source)  # read once: for the key and for the run
    params = {**_model_params(lm), "lengths": [int(n) for n in lengths],
              "skip": list(setting.skip), "config": asdict(cfg), **_variant_params(lm, setting),
              "text_sha": store.content_sha(texts)}

    def compute() -> dict:
        return {"rows": _by_length(lm, lengths, setting, cfg, texts, name, progress)}

    payload, hit = store.cached(KIND_BY_LENGTH, params, compute, use_cache, lambda p: check(
        KIND_BY_LENGTH, None, p, expect={"lengths": params["lengths"]}), notice)
    return payload["rows"], hit


__all__ = ["TEXT_FIELDS", "read_texts", "length_prompts", "drift_by_length", "cached_drift_by_length"]
