"""Evaluation data sets: named files in the shared data folder, local files, the synthetic
retrieval task, built-in prompts or a hub data set, as tokenised `EvalSet`s."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

from pop_analysis.data.hub_data import hub_records
from pop_analysis.data.readers import DatasetError, json_records, jsonl_records, txt_records
from pop_analysis.engine.generate import encode
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_text
from pop_analysis.engine.hub import unreachable_reason
from pop_analysis.errors import first_line, listed
from pop_analysis.quality.answers import gsm8k_gold
from pop_analysis.quality.items import EvalDataError, EvalItem, EvalSet, fingerprint
from pop_analysis.quality.retrieval import RETRIEVAL_ITEMS, RetrievalConfig, retrieval_items
from pop_analysis.store.paths import shared_data_dir

NAMED = {"gsm8k": "gsm8k_test.jsonl", "gsm8k_train": "gsm8k_train.jsonl",
         "wizardlm": "wizardlm_testset.jsonl", "selfinstruct": "selfinstruct_seed_tasks.jsonl"}
PROMPT_FIELDS = ("question", "prompt", "instruction", "Instruction", "input", "text")
REFERENCE_FIELDS = ("answer", "response", "output", "completion", "target")


def data_dir() -> Path:
    """Where named data sets live: $POP_LAB_DATA, else ../shared/data beside the repository."""
    return shared_data_dir()


def read_records(path: Path, limit: int | None = None) -> list[dict]:
    """Records of a .jsonl / .json / .txt file, read only as far as the first `limit` (the
    streaming readers of pop_analysis.data.readers); errors name the file and line."""
    if not path.is_file():
        raise EvalDataError(f"data file not found: {path}")
    reader = {".jsonl": jsonl_records, ".json": json_records, ".txt": txt_records}.get(path.suffix)
    if reader is None:
        raise EvalDataError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .txt")
    out: list[dict] = []
    records = reader(path)
    try:
        for where, rec in records:
            rec = {"prompt": rec} if path.suffix == ".txt" else rec
            if not isinstance(rec, dict):
                raise EvalDataError(f"{path} {where}: expected a list of objects, got "
                                    f"{type(rec).__name__}")
            out.append(rec)
            if limit is not None and len(out) >= limit:
                break  # the reader is not asked for another record
    except DatasetError as e:
        raise EvalDataError(str(e)) from None
    finally:
        records.close()
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
        prompt_ids = tuple(encode(lm, prompt, raw))  # refused before tokenising when too long
        if ref:
            check_text(lm.adapter, len(ref), "reference answer")  # bounded like a prompt
        ref_ids = tuple(lm.tokenizer(ref, add_special_tokens=False)["input_ids"]) if ref else ()
        items.append(EvalItem(prompt_ids, ref_ids, gold, prompt))
    return items


def load_eval_set(lm: LoadedModel, source: str, limit: int | None = None, raw: bool = False,
                  seed: int = 0) -> EvalSet:
    """An evaluation set from a name (gsm8k, wizardlm, selfinstruct, retrieval[:LENGTH],
    builtin), a local .jsonl/.json/.txt file, or hf:NAME[:split] (needs the network).

    A `limit` beyond the set's size is refused with one line saying how many items it holds.
    """
    if limit is not None and limit < 1:
        raise EvalDataError(f"the sample count must be positive, got {limit}")
    if is_retrieval(source):
        length = _retrieval_length(source)
        items = retrieval_items(lm, RetrievalConfig(n_items=limit or 8, length=length, seed=seed))
        return EvalSet(source, fingerprint(items), tuple(items), "retrieval")
    records = records_of(source, limit)
    enough(source, len(records), limit)
    items = records_to_items(lm, records[:limit] if limit else records, source, raw)
    kind = "gsm8k" if any(it.answer is not None for it in items) else "prompts"
    return EvalSet(source, fingerprint(items), tuple(items), kind)


def is_retrieval(source: str) -> bool:
    return source == "retrieval" or source.startswith("retrieval:")


def records_of(source: str, limit: int | None = None) -> list[dict]:
    """The first `limit` records of a named set, a file, the built-in prompts or a hub set (no
    model needed); an empty set is refused."""
    if source == "builtin":
        from pop_analysis.data.prompts import load_prompts

        records = [{"prompt": p} for p in load_prompts("builtin").prompts]
    elif source.startswith("hf:"):
        records = _hf_records(source, limit)
    else:
        path = data_dir() / NAMED[source] if source in NAMED else Path(os.path.expanduser(source))
        if source not in NAMED and not path.suffix:
            raise EvalDataError(f"unknown data set {source!r}: give one of {', '.join(NAMED)}, "
                                "retrieval[:LENGTH], builtin, hf:NAME or a .jsonl/.json/.txt file")
        records = read_records(path, limit)
    if not records:
        raise EvalDataError(f"data set {source!r} holds no records")
    return records


def enough(source: str, have: int, asked: int | None, flag: str = "") -> None:
    """Refuse a size beyond what the data holds (a silent clamp hides it, a huge one runs for
    hours), saying how many items there are."""
    if asked is not None and asked > have:
        by = f" by {flag}" if flag else ""
        raise EvalDataError(f"{source} holds {have} items, fewer than the {asked} asked for{by}; "
                            f"ask for at most {have}")


def check_size(source: str, n: int, flag: str = "--samples") -> None:
    """Before any model loads: refuse `n` items where the data set holds fewer (the synthetic
    retrieval task: its distinct needles). A hub set is counted as it is read."""
    if is_retrieval(source):
        enough("the retrieval task", RETRIEVAL_ITEMS, n, flag)
    elif not source.startswith("hf:"):
        enough(source, len(records_of(source, n)), n, flag)


def _retrieval_length(source: str) -> int:
    text = source.split(":", 1)[1] if ":" in source else "512"
    try:
        return int(text)
    except ValueError:
        raise EvalDataError(f"retrieval length must be a whole number of tokens, got {text!r}") from None


def _hf_records(source: str, limit: int | None) -> list[dict]:
    """The first `limit` rows of a hub split (default test; GSM8K's config main), read from the
    hub's Parquet export by the bounded reader: the prompt and reference columns only."""
    reason = unreachable_reason()
    if reason is not None:
        raise EvalDataError(f"cannot load {source} from the hub: it is out of reach ({reason})")
    name = source[3:].split(":")[0]
    records = hub_records(source, _eval_columns, "test", "main" if name.endswith("gsm8k") else None)
    try:
        return [rec for _, rec in itertools.islice(records, limit)]
    except DatasetError as e:
        raise EvalDataError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - offline or unknown: one line
        raise EvalDataError(f"cannot load {source} from the hub: {first_line(e)}") from None
    finally:
        records.close()


def _eval_columns(names) -> list[str]:
    cols = [n for n in names if n in PROMPT_FIELDS + REFERENCE_FIELDS]
    if not any(n in PROMPT_FIELDS for n in cols):
        raise DatasetError(f"no prompt column (one of {', '.join(PROMPT_FIELDS)}) among "
                           f"{listed(names)}")
    return cols


def gsm8k_prompt(question: str, shots=()) -> str:
    """'Question: ...\\nAnswer: ...' few-shot text ending with the open question."""
    parts = [f"Question: {q}\nAnswer: {a}" for q, a in shots]
    parts.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(parts)


def gsm8k_shots(n: int, source: str = "gsm8k_train") -> list[tuple[str, str]]:
    """The first n (question, answer) pairs of the GSM8K train file."""
    if n <= 0:
        return []
    recs = read_records(data_dir() / NAMED[source], n)
    return [(r["question"], r["answer"]) for r in recs]


def gsm8k_fewshot_set(lm: LoadedModel, n: int, n_shot: int = 0, source: str = "gsm8k",
                      raw: bool = False) -> EvalSet:
    """GSM8K questions as few-shot prompts (no reference: the model's own answer is scored);
    generation is cut where the model starts another 'Question:'."""
    path = data_dir() / NAMED[source] if source in NAMED else Path(source)
    recs = read_records(path, n)
    enough(source, len(recs), n)
    shots = gsm8k_shots(n_shot)
    items = [EvalItem(tuple(encode(lm, gsm8k_prompt(r["question"], shots), raw)), (),
                      gsm8k_gold(r["answer"]), r["question"], {"stop_text": "\n\nQuestion:"})
             for r in recs[:n]]
    return EvalSet(f"{source} {n_shot}-shot", fingerprint(items), tuple(items), "gsm8k")
