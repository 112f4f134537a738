"""Prompt sets: built-in, every local format, field detection, and every bad-file case."""
import json

import pandas as pd
import pytest

from pop_analysis.data.builtin_prompts import CATEGORIES, PROMPTS
from pop_analysis.data.prompts import (
    BUILTIN_NAME,
    DatasetError,
    fingerprint,
    load_prompts,
)


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_builtin_set_is_large_varied_and_stable():
    s = load_prompts(BUILTIN_NAME)
    assert s.name == "builtin" and len(s) >= 100 and len(set(s.prompts)) == len(s)
    assert set(CATEGORIES) == {"arithmetic", "code", "writing", "factual", "reasoning", "summarising"}
    assert all(len(v) >= 15 for v in CATEGORIES.values())
    first6 = set(s.prompts[:6])  # any prefix mixes the kinds
    assert all(len(first6 & set(v)) == 1 for v in CATEGORIES.values())
    assert s.fingerprint == fingerprint(PROMPTS) == load_prompts("builtin").fingerprint
    assert load_prompts("builtin", limit=5).prompts == s.prompts[:5]


@pytest.mark.parametrize("field", ["instruction", "question", "prompt", "text", "Instruction"])
def test_jsonl_detects_the_prompt_field(tmp_path, field):
    rows = [{"id": i, field: f"prompt {i}", "answer": "x"} for i in range(3)]
    path = write(tmp_path, "d.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    s = load_prompts(path)
    assert s.prompts == ("prompt 0", "prompt 1", "prompt 2") and s.name == "d.jsonl"


def test_detection_order_prefers_instruction_and_joins_input(tmp_path):
    rows = [{"text": "t", "instruction": "Translate to French.", "input": "Good morning"},
            {"text": "t", "instruction": "Say hi.", "input": ""}]
    s = load_prompts(write(tmp_path, "a.jsonl", "\n".join(map(json.dumps, rows))))
    assert s.prompts == ("Translate to French.\n\nGood morning", "Say hi.")


@pytest.mark.parametrize("key,turns", [
    ("messages", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi?"},
                  {"role": "assistant", "content": "Hello"}]),
    ("conversations", [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello"}]),
])
def test_chat_records_take_the_first_user_turn(tmp_path, key, turns):
    s = load_prompts(write(tmp_path, "c.jsonl", json.dumps({key: turns})))
    assert s.prompts == ("Hi?",)


def test_explicit_field_and_limit(tmp_path):
    rows = [{"question": f"q{i}", "body": f"b{i}"} for i in range(5)]
    path = write(tmp_path, "f.jsonl", "\n".join(map(json.dumps, rows)))
    assert load_prompts(path, field="body", limit=2).prompts == ("b0", "b1")
    assert load_prompts(path, limit=3).fingerprint != load_prompts(path).fingerprint


def test_json_list_wrapper_and_strings(tmp_path):
    assert load_prompts(write(tmp_path, "a.json", json.dumps([{"prompt": "p1"}, "p2"]))).prompts == ("p1", "p2")
    wrapped = json.dumps({"version": 1, "data": [{"question": "q"}]})
    assert load_prompts(write(tmp_path, "b.json", wrapped)).prompts == ("q",)


def test_csv_parquet_txt(tmp_path):
    csv_text = 'id,question\n1,"What is 2+2?"\n2,"A multi-line\nquestion"\n'
    assert load_prompts(write(tmp_path, "a.csv", csv_text)).prompts == ("What is 2+2?", "A multi-line\nquestion")
    pq = tmp_path / "a.parquet"
    pd.DataFrame({"instruction": ["one", "two"], "n": [1, 2]}).to_parquet(pq)
    assert load_prompts(str(pq)).prompts == ("one", "two")
    assert load_prompts(write(tmp_path, "a.txt", "first\n\n  second  \n")).prompts == ("first", "second")


def test_shared_data_sets(shared_data):
    gsm = load_prompts(str(shared_data / "gsm8k_test.jsonl"), limit=16)
    assert len(gsm) == 16 and gsm.prompts[0].startswith("Janet")
    wiz = load_prompts(str(shared_data / "wizardlm_testset.jsonl"))  # capitalised "Instruction"
    assert len(wiz) > 100


@pytest.mark.parametrize("name,text,match", [
    ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": "broken"\n', r"bad\.jsonl line 2: invalid JSON"),
    ("bad.jsonl", '{"prompt": "ok"}\n\n{"other": 1}\n', r"bad\.jsonl line 3: field 'prompt' missing"),
    ("bad.jsonl", '{"prompt": "ok"}\n[1, 2]\n', r"bad\.jsonl line 2: expected an object"),
    ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": "  "}\n', r"bad\.jsonl line 2: empty prompt"),
    ("bad.jsonl", '{"prompt": 5}\n', r"bad\.jsonl line 1: field 'prompt' holds int"),
    ("bad.jsonl", '{"answer": "no prompt"}\n', r"bad\.jsonl line 1: no prompt field found"),
    ("bad.jsonl", '{"messages": [{"role": "assistant", "content": "x"}]}\n', r"line 1: chat holds no user turn"),
    ("bad.json", '[{"prompt": "a"},\n {"prompt": }]', r"bad\.json line 2: invalid JSON"),
    ("bad.json", '{"a": ["x"], "b": ["y"]}', r"bad\.json line 1: expected a list.*exactly one"),
    ("bad.json", '"just a string"', r"bad\.json line 1: expected a list"),
    ("bad.json", '[{"prompt": "a"}, {"q": "b"}]', r"bad\.json item 2: field 'prompt' missing"),
    ("bad.csv", "id,prompt\n1,hello\n2,hi,extra\n", r"bad\.csv line 3: more values"),
    ("bad.csv", "", r"bad\.csv line 1: no header"),
    ("bad.csv", "id,body\n1,hello\n", r"bad\.csv line 2: no prompt field"),
    ("empty.jsonl", "\n\n", r"empty\.jsonl: no prompts found"),
    ("empty.txt", "  \n", r"empty\.txt: no prompts found"),
    ("empty.json", "[]", r"empty\.json: no prompts found"),
    ("bad.parquet", "not parquet at all", r"bad\.parquet: not a readable Parquet"),
    ("bad.xml", "<a/>", r"bad\.xml: unsupported file type"),
])
def test_bad_files_name_file_and_line(tmp_path, name, text, match):
    with pytest.raises(DatasetError, match=match):
        load_prompts(write(tmp_path, name, text))


def test_bad_sources(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DatasetError, match=r"latin1\.txt line 1: not UTF-8"):
        load_prompts(str(tmp_path / "latin1.txt"))
    with pytest.raises(DatasetError, match="limit"):
        load_prompts("builtin", limit=0)
    with pytest.raises(DatasetError, match="hf:NAME"):
        load_prompts("hf:")


def test_hf_source_offline_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DatasetError, match=r"hf:no-such-owner/no-such-set:test: cannot stream"):
        load_prompts("hf:no-such-owner/no-such-set:test", limit=3)


def test_hf_source_names_are_parsed_before_any_request():
    """Reading a hub data set (its Parquet export) is tested in test_data_bombs.py."""
    with pytest.raises(DatasetError, match="expected hf:NAME"):
        load_prompts("hf:a:b:c:d")
