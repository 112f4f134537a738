"""Three disjoint splits: overlapping item ranges of one file, the same text under another name
(a copy of the file, a case or white-space variant) and overlapping ranking prompts are refused
in one line before any model loads; disjoint splits pass with a fingerprint each."""
import json

import pytest

from pop_analysis.quality.splits import (SplitError, check_disjoint, eval_split, item_fingerprint,
    make_splits, ranking_split)

GSM8K = "gsm8k"  # the shared data file, read by path


def test_disjoint_splits_pass_and_carry_fingerprints():
    ranking, sel, cert = make_splits(("wizardlm", 8), (GSM8K, 0, 20), (GSM8K, 20, 30))
    assert (sel.n, cert.offset, cert.n, ranking.n) == (20, 20, 30, 8)
    assert len(set(sel.fingerprints)) == 20 and sel.fingerprint != cert.fingerprint
    assert sel.record()["fingerprint"] == sel.fingerprint and len(sel.fingerprint) == 16
    assert eval_split("selection", GSM8K, 0, 20) == sel, "fingerprints are reproducible"


def test_overlapping_offsets_of_one_file_are_refused():
    with pytest.raises(SplitError, match="overlaps the certification split") as e:
        make_splits(("wizardlm", 8), (GSM8K, 0, 100), (GSM8K, 50, 300))
    assert "gsm8k items 0-99" in str(e.value) and "\n" not in str(e.value)


def test_the_same_text_under_another_name_is_refused(tmp_path):
    source = eval_split("selection", GSM8K, 0, 5)
    rows = [json.loads(line) for line in open(source.path)][:5]
    copy = tmp_path / "copy.jsonl"  # another file; item 3 is GSM8K's item 3, shouted
    rows = [{"question": f"A new question {i}?", "answer": "#### 1"} for i in range(3)] + \
        [{"question": "  " + rows[3]["question"].upper() + " ", "answer": rows[3]["answer"]}]
    copy.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(SplitError, match=r"share 1 item\(s\) with the same text") as e:
        check_disjoint([source, eval_split("certification", str(copy), 0, 4)])
    assert "\n" not in str(e.value)


def test_ranking_prompts_that_are_evaluation_items_are_refused():
    with pytest.raises(SplitError, match=r"ranking split \(gsm8k items 0-9\) overlaps the selection split"):
        make_splits((GSM8K, 10), (GSM8K, 0, 20), (GSM8K, 20, 20))
    assert ranking_split(GSM8K, 10).fingerprints == eval_split("x", GSM8K, 0, 10).fingerprints


def test_a_split_beyond_the_data_is_one_line():
    with pytest.raises(Exception, match="holds 1319 items") as e:
        eval_split("certification", GSM8K, 1300, 100)
    assert "\n" not in str(e.value)
    assert item_fingerprint("Hello  World") == item_fingerprint("hello world")
