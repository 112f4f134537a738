"""The timing protocol on the embedded model: an empty skip set times near 1."""
from pop_analysis.speed.timing import TimingConfig
from pop_vllm.run_setting import RunSetting


def test_empty_skip_set_times_near_one_on_the_embedded_model(embedded):
    """The real path: full vs POP with nothing skipped does the same work. A loose band only
    (a shared machine moves single rounds); the protocol's median must not invent a speedup."""
    from pop_analysis.speed.bench import random_prompt, time_prefill

    ids = random_prompt(embedded, 16)  # (1, 16)
    p = time_prefill(embedded, ids, RunSetting(()), TimingConfig(min_rounds=9, budget_s=0.5))
    assert (p.ideal_speedup, p.roofline_speedup) == (1.0, 1.0)
    assert p.timing.rounds >= 9 and p.timing.first[:2] == ["full", "variant"]
    assert 0.75 <= p.speedup <= 1.33, (p.speedup, p.timing.ratios, p.timing.note)
    assert p.timing.low <= p.speedup <= p.timing.high
