"""Calibration of the embedded model: cached in the store, and the CLI's JSON."""
import json
import math

import torch

from pop_analysis.cli import main
from pop_analysis.data.prompts import load_prompts
from pop_analysis.importance.calibrate import (
    KIND,
    CalibrationConfig,
    cached_calibration,
    list_calibrations,
    load_calibration,
)
from pop_analysis.store import results as store


def test_embedded_calibration_is_cached(embedded, tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    prompts = load_prompts("builtin")
    cfg = CalibrationConfig(n_samples=3, max_new_tokens=8, batch_size=3)
    r, hit = cached_calibration(embedded, prompts, cfg)
    assert not hit and r.n_samples == 3 and r.n_layers == 30
    arrays = [r.prefill, r.decode, r.prefill_std, r.decode_std, r.block_influence["prefill"],
              r.block_influence["decode"], *r.prefill_samples, *r.decode_samples]
    for a in arrays:
        assert len(a) == 30 and all(math.isfinite(x) and x >= 0 for x in a)
    assert r.prefill[-1] == 0.0 and r.decode[-1] > 0
    again, hit = cached_calibration(embedded, prompts, CalibrationConfig(n_samples=3, max_new_tokens=8,
                                                                         batch_size=1))
    assert hit and again == r  # batch size only changes speed, so the entry is shared
    entries = list_calibrations()
    assert len(entries) == 1 and load_calibration(entries[0]["key"]) == r
    path = store.results_dir(KIND) / f"{entries[0]['key']}.json"
    path.write_text('{"payload": {"model": "half a resu', encoding="utf-8")  # corrupt entry
    assert load_calibration(entries[0]["key"]) is None
    redo, hit = cached_calibration(embedded, prompts, cfg)  # recomputed, not fatal
    assert not hit and torch.allclose(torch.tensor(redo.decode_samples), torch.tensor(r.decode_samples))
    assert load_calibration(entries[0]["key"]) is not None


def test_cli_json(embedded, tmp_path, monkeypatch, capsys, shared_data):
    import pop_analysis.commands.calibrate as command

    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))  # results only: the model is reused below
    monkeypatch.setattr(command, "load", lambda args: embedded)
    args = ["calibrate", "--dataset", str(shared_data / "gsm8k_test.jsonl"), "--samples", "2",
            "--max-new-tokens", "3", "--batch-size", "2", "--device", "cpu", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) == {"model", "dataset", "n_samples", "prefill", "decode", "prefill_std",
                        "decode_std", "block_influence", "seconds", "samples_per_s", "suggested_skip"}
    assert out["n_samples"] == 2 and len(out["decode"]) == 30
    assert out["suggested_skip"]["paper"] == list(range(20, 30))
    assert len(out["suggested_skip"]["adaptive"]) == 10
    assert main(["calibrate", "--dataset", str(tmp_path / "nope.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "nope.jsonl: no such file" in err[-1]
