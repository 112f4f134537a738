"""Calibration batches: sorted by length, even sizes, capped by the memory a graph would take."""
import pytest
import torch

from pop_analysis.importance import batch_plan
from pop_analysis.importance.batch_plan import (
    bytes_per_row,
    kept_floats,
    plan_batches,
    rows_that_fit,
)
from pop_analysis.importance.calibrate import CalibrationConfig, calibrate_ids

from tiny import tiny_model, tiny_prompt


def test_batches_are_sorted_by_length_and_even():
    lengths = [9, 3, 7, 1, 5, 8, 2, 6, 4, 10, 11, 12, 13, 14, 15, 16, 17]  # 17 prompts
    batches = plan_batches(lengths, 16)
    assert [len(b) for b in batches] == [9, 8]  # not 16 + 1
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(17))
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert plan_batches(lengths, 100) == [flat]
    assert [len(b) for b in plan_batches(lengths, 1)] == [1] * 17
    assert plan_batches([], 4) == []


def test_memory_caps_the_rows():
    shape = tiny_model("llama").adapter.shape
    per_row = bytes_per_row(shape, 100)
    assert per_row > 0
    assert kept_floats(shape, int(per_row), 100) == pytest.approx(batch_plan.ACTIVATION_FLOATS)
    assert rows_that_fit(shape, 100, int(10 * per_row / batch_plan.MEMORY_SHARE)) == 10
    assert rows_that_fit(shape, 100, 1) == 1  # always at least one row
    assert rows_that_fit(shape, 100, None) is None  # unknown memory: no cap
    assert rows_that_fit(shape, 200, 10 ** 9) < rows_that_fit(shape, 100, 10 ** 9)


def test_short_memory_means_smaller_batches_and_the_same_scores(monkeypatch):
    lm = tiny_model("llama", seed=4)
    prompts = [tiny_prompt(n, seed=60 + n) for n in (3, 8, 5, 6, 2)]
    cfg = CalibrationConfig(n_samples=5, max_new_tokens=4, batch_size=5)
    plenty = calibrate_ids(lm, prompts, cfg)
    sizes = []
    real = batch_plan.plan_batches
    monkeypatch.setattr("pop_analysis.importance.calibrate.plan_batches",
                        lambda lengths, rows: sizes.append(rows) or real(lengths, rows))
    row = bytes_per_row(lm.adapter.shape, 8 + 4)
    monkeypatch.setattr("pop_analysis.importance.calibrate.available_bytes",
                        lambda: int(2 * row / batch_plan.MEMORY_SHARE))  # room for 2 rows
    short = calibrate_ids(lm, prompts, cfg)
    assert sizes and set(sizes) == {2}
    assert short.response_tokens == plenty.response_tokens
    for a, b in ((plenty.prefill_samples, short.prefill_samples),
                 (plenty.decode_samples, short.decode_samples)):
        a, b = torch.tensor(a), torch.tensor(b)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
