"""Evaluation sets and the retrieval task with the embedded model's tokenizer and context."""
import json

import pytest

from pop_analysis.quality.evalsets import load_eval_set, read_records
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.items import EvalDataError, EvalItem
from pop_analysis.quality.metrics import (
    choose,
    greedy_tokens,
)
from pop_analysis.quality.retrieval import (
    RetrievalConfig,
    RetrievalError,
    grid_items,
    retrieval_items,
)
from pop_vllm.run_setting import RunSetting

from tiny import forced_model, tiny_model


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def tokenizer(embedded):
    return embedded.tokenizer


def test_forced_model_scores_100_percent(tokenizer):
    lm, seven = forced_model(tokenizer)
    prompt = tokenizer("Question: what is seven sevens?", add_special_tokens=False)["input_ids"]
    for variant, skip in (("full", ()), ("pop", (3, 4, 5)), ("static", (4, 5))):
        assert greedy_tokens(lm, prompt, RunSetting(skip, variant), 5) == [seven] * 5
    item = EvalItem(tuple(prompt), (seven,) * 4, answer="7777777")
    wrong = EvalItem(tuple(prompt), (seven,), answer="8")
    out = evaluate_variants(lm, [item, wrong], [Arm("pop", RunSetting((3, 4, 5)))], 7)
    s = out["pop"]
    assert s.answer_correct == [1.0, 0.0] and s.greedy_agreement == [1.0, 1.0]
    assert max(s.continuation_nll) < 1e-6 and s.teacher_forced_top1 == [1.0, 1.0]
    other = tokenizer("8", add_special_tokens=False)["input_ids"]
    best, scores = choose(lm, prompt, [other * 2, [seven] * 2, other + [seven]],
                          RunSetting((3, 4, 5)))
    assert best == 1 and scores[0] < scores[2] < scores[1]
    assert out["full"].answer_correct == [1.0, 0.0]


def test_gsm8k_set_from_shared_file(embedded, shared_data):
    s = load_eval_set(embedded, "gsm8k", limit=3)
    assert s.kind == "gsm8k" and len(s.items) == 3 and s.items[0].answer == "18"
    assert embedded.tokenizer.decode(list(s.items[0].reference_ids)).endswith("#### 18")
    w = load_eval_set(embedded, "wizardlm", limit=2)
    assert w.kind == "prompts" and w.items[0].reference_ids == ()


@pytest.mark.parametrize("content, suffix, message", [
    ('{"question": "a"}\n{not json}\n', ".jsonl", "line 2"),
    ('{"answer": "#### 3"}\n', ".jsonl", "no prompt field"),
    ('[1, 2]', ".json", "list of objects"),
    ('', ".jsonl", "holds no records"),
    ('a,b\n', ".csv", "unsupported file type"),
])
def test_bad_data_files(tmp_path, embedded, content, suffix, message):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    with pytest.raises(EvalDataError, match=message):
        load_eval_set(embedded, str(path))


def test_missing_and_unknown_sets(embedded, tmp_path):
    with pytest.raises(EvalDataError, match="not found"):
        read_records(tmp_path / "nope.jsonl")
    with pytest.raises(EvalDataError, match="unknown data set"):
        load_eval_set(embedded, "gsm9k")
    with pytest.raises(EvalDataError, match="positive"):
        load_eval_set(embedded, "gsm8k", limit=0)


def test_local_file_with_references(tmp_path, embedded):
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"Say {w}", "response": w})
                              for w in ("yes", "no")) + "\n")
    s = load_eval_set(embedded, str(path))
    assert [embedded.tokenizer.decode(list(i.reference_ids)) for i in s.items] == ["yes", "no"]
    assert s.fingerprint == load_eval_set(embedded, str(path)).fingerprint


def test_retrieval_items_are_deterministic_and_hold_the_needle(embedded):
    cfg = RetrievalConfig(n_items=3, length=300, depths=(0.0, 0.5, 1.0))
    a, b = retrieval_items(embedded, cfg), retrieval_items(embedded, cfg)
    assert a == b
    tok = embedded.tokenizer
    for item in a:
        key, code = item.meta["key"], item.answer
        assert f"The pass code for the {key} is {code}." in item.text
        assert tok.decode(list(item.reference_ids)).strip() == code
        assert abs(len(item.prompt_ids) - 300) < 20, len(item.prompt_ids)
        # the prompt ends with the answer's first words, so the code comes next
        assert tok.decode(list(item.prompt_ids[-6:])).rstrip().endswith(f"{key} is")
        assert tok.decode(list(item.reference_ids[:1])) == code[0]  # digits come first
        # the key is asked for before the notes as well as after them
        assert item.text.startswith(f"Find the pass code for the {key} in these notes")
    sentences = [it.text.split("\n\n")[1].split(". ") for it in a]
    at = [next(i for i, s in enumerate(ss) if a[k].meta["key"] in s)
          for k, ss in enumerate(sentences)]
    assert at[0] < at[1] < at[2], at  # depth 0, 0.5, 1 of the notes
    other = retrieval_items(embedded, RetrievalConfig(n_items=3, length=300, seed=1))
    assert [i.answer for i in other] != [i.answer for i in a]
    plain = retrieval_items(embedded, RetrievalConfig(n_items=3, length=300, depths=(0.0, 0.5, 1.0),
                                                       ask_first=False))
    assert all(i.text.startswith("Notes (some give pass codes):") and i.meta["key"] in i.text
               for i in plain)  # the old heading: the key is named only by the question


def test_retrieval_rejects_impossible_configs(embedded, lm):
    with pytest.raises(RetrievalError, match="at least"):
        retrieval_items(embedded, RetrievalConfig(length=40))
    with pytest.raises(RetrievalError, match="depths"):
        retrieval_items(embedded, RetrievalConfig(depths=(1.5,)))
    with pytest.raises(RetrievalError, match="no tokenizer"):
        retrieval_items(lm, RetrievalConfig())


def test_retrieval_grid_covers_every_depth_and_length(embedded):
    depths = (0.0, 0.5, 1.0)
    items = grid_items(embedded, (256, 700), depths, per_cell=2)
    cells = [(it.meta["length"], it.meta["depth"]) for it in items]
    assert len(items) == 12 and sorted({d for _, d in cells}) == list(depths)
    for it in items:
        n = it.meta["length"]
        assert n == len(it.prompt_ids) and (abs(n - 256) < 20 or abs(n - 700) < 20), n
        notes = it.text.split("\n\n")[1].split(". ")
        facts = [i for i, s in enumerate(notes) if "pass code" in s]
        assert len(facts) == 2  # the needle and one distractor
        at = next(i for i, s in enumerate(notes) if it.meta["key"] in s)
        assert abs(at / (len(notes) - 1) - it.meta["depth"]) < 0.1, (at, len(notes), it.meta)
    assert grid_items(embedded, (256,), depths, per_cell=2) == items[:6]  # deterministic
