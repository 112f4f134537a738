"""The step-through on both embedded models with a non-contiguous skip set: the grid equals the
engine's per-layer call counts of the same run, the cells are the method's, the caches complete."""
import pytest

from pop_analysis.inspection import stepthrough as stp

from step_checks import assert_flops_and_frames, assert_grid_equals_counts, assert_pop_structure

CFG = stp.StepConfig(decode_steps=1, rounds=3)  # the fewest: the grid is what is checked
PROMPT = "The first three planets from the Sun are Mercury, Venus and"


@pytest.mark.parametrize("name", ["embedded", "gemma"])
def test_grid_equals_call_counts_on_the_real_model(name, request):
    lm = request.getfixturevalue(name)
    n = lm.adapter.n_layers
    skip = (n // 3, n // 3 + 2, *range(n - 4, n))  # two lone layers and a tail block
    ids = stp.encode_short(lm, PROMPT)
    rec = stp.record(lm, ids, skip, CFG, PROMPT)
    assert_grid_equals_counts(rec)
    assert_pop_structure(rec, skip)
    assert_flops_and_frames(rec, lm.adapter.shape, skip)
    assert rec.tokens[-1].strip() == "and" and rec.prompt == PROMPT
    boundary = next(s for s in rec.steps if s["stage"] == "boundary")
    assert len(boundary["top"]) == 5 and 0 < boundary["top"][0][2] <= 1


def test_a_long_prompt_is_refused_before_any_work(embedded):
    with pytest.raises(ValueError, match=r"takes 2-48 tokens; this prompt has \d+"):
        stp.encode_short(embedded, " ".join(f"w{i}" for i in range(40)))
