"""Stored records are checked before use: wrong shapes, bad fields, other keys or layer counts are misses and are recomputed with one warning; an unwritable cache loses only the caching."""
import json
import os

import pytest

from pop_analysis.cli import main
from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.models import model_from_hf
from pop_analysis.experiments.sweep import SweepConfig, cached_sweep
from pop_analysis.importance.calibrate import (
    KIND,
    CalibrationConfig,
    CalibrationResult,
    cached_calibration,
    list_calibrations,
    load_calibration,
    suggest_skip,
)
from pop_analysis.inspection.drift import DriftResult, cached_drift
from pop_analysis.store import results as store
from pop_analysis.store.records import RecordError, check
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model

CFG = CalibrationConfig(n_samples=2, max_new_tokens=3, batch_size=2)


def entry_path(key: str):
    return store.results_dir(KIND) / f"{key}.json"


def edit_payload(key: str, **changes) -> None:
    path = entry_path(key)
    entry = json.loads(path.read_text(encoding="utf-8"))
    entry["payload"].update(changes)
    path.write_text(json.dumps(entry), encoding="utf-8")


def notice_lines(err: str) -> list[str]:
    """stderr lines other than the progress bar (redrawn with carriage returns)."""
    return [ln for ln in err.split("\n") if ln.strip() and "\r" not in ln]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def prompts():
    return load_prompts("builtin", limit=2)


@pytest.fixture(scope="module")
def lm(embedded):
    """A 6-layer random llama that speaks the embedded tokenizer: real records, cheaply."""
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer), max_position_embeddings=1024)
    return model_from_hf(tiny.model, embedded.tokenizer, name="tiny-tok")


def test_a_record_of_the_wrong_shape_is_a_miss_and_is_recomputed(lm, cache, prompts):
    first, hit = cached_calibration(lm, prompts, CFG)
    assert not hit
    key = list_calibrations()[0]["key"]
    edit_payload(key, prefill=[1.0, 2.0, 3.0, 4.0, 5.0])  # the red-team edit
    notes = []
    again, hit = cached_calibration(lm, prompts, CFG, notice=notes.append)
    assert not hit and len(again.prefill) == 6 and again.prefill == first.prefill
    assert len(notes) == 1 and "prefill has 5 entries, expected 6" in notes[0], notes
    assert "\n" not in notes[0]
    # The recomputed result replaced the bad entry: the next call is a silent hit.
    third, hit = cached_calibration(lm, prompts, CFG, notice=notes.append)
    assert hit and third == again and len(notes) == 1


@pytest.mark.parametrize("change, why", [
    ({"prefill": [0.1] * 5 + [float("inf")]}, "prefill[5] is inf, not a finite number"),
    ({"prefill": [0.1] * 5 + ["0.1"]}, "prefill[5] is '0.1', not a finite number"),
    ({"n_layers": 5}, "the record is for 5 layers, the model has 6"),
    ({"decode_samples": [[0.0] * 6]}, "decode_samples has 1 entries, expected 2"),
    ({"block_influence": {"prefill": [0.0] * 6}}, "block_influence.decode"),
    ({"prefill": None}, "prefill is None, not a list"),
])
def test_every_kind_of_bad_field_is_named(lm, cache, prompts, change, why):
    cached_calibration(lm, prompts, CFG)
    key = list_calibrations()[0]["key"]
    edit_payload(key, **change)
    notes = []
    assert load_calibration(key, 6, notes.append) is None
    assert len(notes) == 1 and why in notes[0], notes


def test_an_entry_under_another_key_or_kind_is_not_trusted(lm, cache, prompts):
    cached_calibration(lm, prompts, CFG)
    key = list_calibrations()[0]["key"]
    other = "0123456789abcdef0123"
    os.link(entry_path(key), entry_path(other))  # the same file under a name it does not hold
    notes = []
    assert load_calibration(other, notice=notes.append) is None
    assert "not those of its file" in notes[0]
    assert [e["key"] for e in list_calibrations()] == [key]  # not even listed
    assert store.load("drift", key) is None  # another kind's folder: a plain miss


def test_a_record_for_another_layer_count_is_a_miss(lm, cache, prompts):
    cached_calibration(lm, prompts, CFG)
    key = list_calibrations()[0]["key"]
    notes = []
    assert load_calibration(key, n_layers=30, notice=notes.append) is None
    assert "the record is for 6 layers, the model has 30" in notes[0]
    assert load_calibration(key) is not None  # alone it is a valid 6-layer record


def test_cli_calibrate_json_recomputes_a_bad_entry_with_one_warning(lm, cache, capsys,
                                                                    monkeypatch):
    import pop_analysis.commands.calibrate as command

    monkeypatch.setattr(command, "load", lambda args: lm)
    args = ["calibrate", "--samples", "1", "--max-new-tokens", "2", "--batch-size", "1", "--json"]
    assert main(args) == 0
    good = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    key = list_calibrations()[0]["key"]
    edit_payload(key, prefill=[1.0, 2.0, 3.0, 4.0, 5.0])
    assert main(args) == 0
    out, err = capsys.readouterr()
    redo = json.loads(out.strip().splitlines()[-1])
    assert redo["prefill"] == good["prefill"] and len(redo["prefill"]) == 6
    assert redo["suggested_skip"] == good["suggested_skip"]
    lines = notice_lines(err)
    assert len(lines) == 1 and lines[0].startswith("warning: stored calibration result"), err


def test_drift_entries_are_checked_against_the_prompt_and_skip_set(lm, cache):
    ids = lm.tokenizer("The cat sat on the mat and looked at the door.")["input_ids"]
    from pop_analysis.inspection.drift import DriftConfig

    cfg = DriftConfig(decode_steps=2)
    first, hit = cached_drift(lm, ids, RunSetting((4, 5)), cfg)
    assert not hit
    path = next(store.results_dir("drift").glob("*.json"))
    entry = json.loads(path.read_text())
    entry["payload"]["hidden_tok"] = entry["payload"]["hidden_tok"][:3]  # 3 layers of 6
    path.write_text(json.dumps(entry))
    notes = []
    again, hit = cached_drift(lm, ids, RunSetting((4, 5)), cfg, notice=notes.append)
    assert not hit and len(again.hidden_tok) == 6 and "hidden_tok has 3 entries" in notes[0]
    check("drift", DriftResult, again.to_dict(), 6, {"prompt_tokens": len(ids)})
    with pytest.raises(RecordError, match="prompt_tokens"):
        check("drift", DriftResult, again.to_dict(), 6, {"prompt_tokens": len(ids) + 1})


def test_unwritable_cache_still_returns_the_result_with_one_notice(lm, cache, prompts):
    (cache / "results").write_text("a file where the results folder should be")
    notes = []
    result, hit = cached_calibration(lm, prompts, CFG, notice=notes.append)
    assert not hit and result.n_layers == 6 and len(result.prefill) == 6
    assert len(notes) == 1 and notes[0].startswith("cannot store the calibration result"), notes


@pytest.mark.parametrize("command", [
    ["calibrate", "--samples", "1", "--max-new-tokens", "2", "--batch-size", "1", "--json"],
    ["drift", "--prompt", "Explain photosynthesis in one line.", "--decode-steps", "1", "--json"],
])
def test_cli_prints_the_result_when_the_cache_cannot_be_written(lm, cache, capsys,
                                                                monkeypatch, command):
    import importlib

    monkeypatch.setattr(importlib.import_module(f"pop_analysis.commands.{command[0]}"), "load",
                        lambda args: lm)
    (cache / "results").write_text("not a folder")
    assert main(command) == 0
    out, err = capsys.readouterr()
    payload = json.loads(out.strip().splitlines()[-1])
    assert payload["model"] == "tiny-tok"
    lines = notice_lines(err)
    assert len(lines) == 1 and lines[0].startswith("warning: cannot store the "), err


def test_a_valid_record_is_safe_to_use(lm, cache, prompts):
    """What passes the check is usable by the code that reads it (suggestions, the CLI report)."""
    from pop_analysis.commands.calibrate import report

    result, _ = cached_calibration(lm, prompts, CFG)
    key = list_calibrations()[0]["key"]
    loaded = load_calibration(key, 6)
    assert isinstance(loaded, CalibrationResult) and loaded == result
    assert report(loaded, True, suggest_skip(loaded)).count("\n") > 6


@pytest.mark.parametrize("kind, cfg", [
    ("ablation", SweepConfig(dataset="wizardlm", variants=("full", "pop"), n_samples=2,
                             max_new_tokens=3, repeats=1, bench_tokens=16)),
    ("length", SweepConfig(lengths=(16, 160), n_samples=1, max_new_tokens=3, repeats=1)),
])
def test_real_sweep_records_pass_their_check(lm, cache, kind, cfg):
    notes = []
    first, hit = cached_sweep(lm, kind, cfg, notice=notes.append)
    again, hit_again = cached_sweep(lm, kind, cfg, notice=notes.append)
    assert (hit, hit_again) == (False, True) and notes == [] and again.rows == first.rows
