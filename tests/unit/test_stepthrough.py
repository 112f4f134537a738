"""The step-through on tiny random models: its grid equals the engine's call counts in the same
run, its cells are the method's, its FLOPs add up, its record is checked like any other."""
import json

import pytest

from pop_analysis.inspection import stepthrough as stp
from pop_analysis.store.records import RecordError, check

from step_checks import assert_flops_and_frames, assert_grid_equals_counts, assert_pop_structure
from tiny import tiny_model, tiny_prompt

CFG = stp.StepConfig(decode_steps=2, rounds=3, top_k=3)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def lm(request):
    return tiny_model(request.param)


@pytest.mark.parametrize("skip", [(4, 5), (1, 3, 4)], ids=["tail", "non-contiguous"])
def test_grid_equals_the_engines_call_counts(lm, skip):
    rec = stp.record(lm, tiny_prompt(8), skip, CFG)
    assert_grid_equals_counts(rec)
    assert_pop_structure(rec, skip)
    assert_flops_and_frames(rec, lm.adapter.shape, skip)
    assert all(len(s["times_ms"]) == CFG.rounds for s in rec.steps)
    assert rec.ttft["rounds"] == CFG.rounds


def test_the_record_round_trips_and_a_broken_one_is_refused(lm):
    rec = stp.record(lm, tiny_prompt(6), (4, 5), CFG)
    back = stp.StepThrough.from_dict(json.loads(json.dumps(rec.to_dict())))
    check(stp.KIND, stp.StepThrough, back.to_dict(), lm.adapter.n_layers)
    bad = rec.to_dict()
    bad["steps"][1]["kv"].pop()  # one layer's row missing
    with pytest.raises(RecordError, match=r"steps\[1\]\.kv"):
        check(stp.KIND, stp.StepThrough, bad, lm.adapter.n_layers)
    with pytest.raises(RecordError, match="the record is for 6 layers"):
        check(stp.KIND, stp.StepThrough, rec.to_dict(), 30)


def test_prompts_outside_the_grid_are_refused_in_one_line(lm):
    with pytest.raises(ValueError, match=r"takes 2-16 tokens, got 17"):
        stp.record(lm, tiny_prompt(17), (5,), CFG)
    with pytest.raises(ValueError, match="decode_steps must lie in 1..8"):
        stp.StepConfig(decode_steps=0)
