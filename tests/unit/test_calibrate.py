"""Calibration on tiny random models: batched sampling, batch-size independence, leave-one-out rows, rank correlation, suggestions."""
import json
import math

import pytest
import torch

from pop_analysis.engine.generate import SamplingConfig
from pop_analysis.engine.generate import run as run_generation
from pop_analysis.importance.calibrate import (
    CalibrationConfig,
    CalibrationResult,
    StageGates,
    calibrate_ids,
    leave_one_out,
    pack,
    response_losses,
    sample_responses,
    spearman,
    suggest_skip,
)
from pop_analysis.importance.gates import gated
from pop_analysis.speed.flops import ideal_speedup
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

PROMPTS = [tiny_prompt(n, seed=n) for n in (1, 5, 9, 3, 12)]


@pytest.fixture(scope="module")
def lm():
    return tiny_model("qwen2", seed=4)


def test_batched_sampling_equals_batch_one_generation(lm):
    cfg = CalibrationConfig(max_new_tokens=7, temperature=1.0)
    seeds = [11, 22, 33, 44, 55]
    together = sample_responses(lm, PROMPTS, seeds, cfg)
    for p, s, got in zip(PROMPTS, seeds, together):
        alone = run_generation(lm, p, RunSetting.full(),
                               cfg=SamplingConfig(max_new_tokens=7, temperature=1.0, seed=s))
        assert got == alone.token_ids


def test_results_do_not_depend_on_batch_size(lm):
    small = calibrate_ids(lm, PROMPTS, CalibrationConfig(n_samples=5, max_new_tokens=5, batch_size=2))
    big = calibrate_ids(lm, PROMPTS, CalibrationConfig(n_samples=5, max_new_tokens=5, batch_size=5))
    assert small.response_tokens == big.response_tokens == [5] * 5
    for key in ("prefill_samples", "decode_samples"):
        a, b = torch.tensor(getattr(small, key)), torch.tensor(getattr(big, key))
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), f"{key}: max_diff {(a - b).abs().max()}"
    assert small.prefill_samples[0] == [0.0] * lm.adapter.n_layers  # one-token prompt first
    mean = torch.tensor(small.decode_samples).mean(0)
    assert torch.allclose(mean, torch.tensor(small.decode), atol=1e-9)


def test_leave_one_out_rows_match_a_direct_ablation(lm):
    prompt, response = PROMPTS[2], tiny_prompt(4, seed=99)
    loo = leave_one_out(lm, prompt, response, rows_per_pass=5)
    batch = pack([prompt], [response])
    L = lm.adapter.n_layers
    with torch.no_grad():
        base = response_losses(lm, batch)[0]
        for stage in ("prefill", "decode"):
            for layer in (0, L - 2):
                g = StageGates.ones(1, L, requires_grad=False)
                getattr(g, stage)[0, layer] = 0.0
                with gated(lm.adapter, g, batch.stages):
                    want = response_losses(lm, batch)[0] - base
                assert float(loo[stage][layer]) == pytest.approx(float(want), rel=1e-4, abs=1e-5)
    assert float(loo["prefill"][L - 1]) == 0.0  # last layer's prefill outputs reach no logit


def test_loo_and_rank_correlation_in_a_run(lm):
    seen = []
    r = calibrate_ids(lm, PROMPTS, CalibrationConfig(n_samples=4, max_new_tokens=4, batch_size=3,
                                                     loo_samples=2), progress=seen.append)
    assert set(r.loo) == {"prefill", "decode"} and len(r.loo["decode"]) == lm.adapter.n_layers
    assert all(-1 <= r.rank_corr[k] <= 1 for k in ("prefill", "decode"))
    for k in ("prefill", "decode"):  # the correlation ranks the LOO samples' own Taylor scores
        own = torch.tensor(getattr(r, f"{k}_samples")[:2]).mean(0).tolist()
        assert r.loo_taylor[k] == pytest.approx(own)
        assert r.rank_corr[k] == pytest.approx(spearman(own, r.loo[k]))
    assert seen[-1].done == seen[-1].total == 6 and seen[0].done == 0
    assert [u.done for u in seen] == sorted(u.done for u in seen)
    back = CalibrationResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def fake_result(prefill, n_layers=None):
    L = n_layers or len(prefill)
    shape = {"n_layers": L, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
             "intermediate": 128, "vocab": 256, "max_positions": 1024}
    zeros = [0.0] * L
    return CalibrationResult(model="m", dataset="d", n_samples=1, n_layers=L, prefill=list(prefill),
                             decode=zeros, prefill_std=zeros, decode_std=zeros,
                             prefill_samples=[list(prefill)], decode_samples=[zeros],
                             block_influence={"prefill": zeros, "decode": zeros}, loo=None,
                             rank_corr=None, seconds=1.0, samples_per_s=1.0, config={}, shape=shape)


def test_suggest_skip():
    from pop_analysis.engine.adapter import Shape

    r = fake_result([5, 0.1, 4, 3, 0.2, 2, 0.3, 1, 0.5])  # 9 layers: paper skips the last 3
    s = suggest_skip(r)
    assert s["paper"].layers == (6, 7, 8) and s["adaptive"].layers == (1, 4, 6)
    want = ideal_speedup(Shape(**r.shape), 512, RunSetting((1, 4, 6)))
    assert s["adaptive"].ideal_speedup == pytest.approx(want)
    assert s["paper"].ideal_speedup > 1.0 and "threshold" not in s
    assert suggest_skip(r, n_skip=2, contiguous_tail=True)["adaptive"].layers == (6, 7)
    t = suggest_skip(r, threshold=0.6)
    assert t["threshold"].layers == (1, 4, 6, 8)
    assert suggest_skip(r, threshold=0.6, contiguous_tail=True)["threshold"].layers == (8,)
    assert len(suggest_skip(r, threshold=100)["threshold"].layers) == 8  # never every layer
    with pytest.raises(ValueError, match="n_skip"):
        suggest_skip(r, n_skip=9)
