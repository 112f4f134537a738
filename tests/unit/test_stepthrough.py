"""The step-through on tiny random models: its grid equals the engine's call counts in the same
run, its cells are the method's, its FLOPs add up, its record is checked like any other."""
import json

import pytest
import torch

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
    assert_one_clock(rec)


def assert_one_clock(rec) -> None:
    """The clock's bars are each run's median round: its first-token mark is the headline's
    median TTFT, and every bar is that round's own time of the step."""
    for run, median in (("full", rec.ttft["full_ms"]), ("pop", rec.ttft["pop_ms"])):
        shown = rec.ttft["clock"][run]
        prompt = [s for s in rec.steps if s["run"] == run and s["stage"] in ("prefill", "boundary")]
        end = prompt[-1]["start_ms"] + prompt[-1]["time_ms"]
        assert end == pytest.approx(median, rel=1e-9), (run, end, median)
        assert all(s["time_ms"] == s["times_ms"][shown] for s in rec.steps if s["run"] == run)


def test_the_median_round_is_one_rounds_index():
    assert stp.median_round([5.0, 1.0, 3.0]) == 2
    assert stp.median_round([2.0, 9.0, 4.0, 1.0, 7.0]) == 2


def test_the_counters_count_matmuls_not_module_calls(lm):
    """The engine's counters see a layer's weights multiplied even without its module being
    called, and they add no hook: the step-through's hooks are another witness."""
    import torch

    from pop_analysis.engine.counters import count_calls

    a = lm.adapter
    with count_calls(a) as counts:
        assert not any(m._forward_hooks or m._forward_pre_hooks for layer in a.layers for m in layer.modules())
        x = torch.zeros(1, 2, a.o_proj(1).in_features)  # (1, 2, heads * head_dim)
        torch.nn.functional.linear(x, a.o_proj(1).weight)  # no module call
        a.k_proj(2)(torch.zeros(1, 2, a.shape.hidden))  # (1, 2, hidden)
    got = counts.as_dict()["prefill"]
    assert got["attention"][1] == 1 and sum(got["attention"]) == 1
    assert got["k_proj"][2] == 1 and sum(got["k_proj"]) == 1 and sum(got["ffn"]) == 0

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
    with pytest.raises(ValueError, match=r"takes 2-48 tokens, got 49"):
        stp.record(lm, tiny_prompt(49), (5,), CFG)
    with pytest.raises(ValueError, match="decode_steps must lie in 1..8"):
        stp.StepConfig(decode_steps=0)
    with pytest.raises(ValueError, match="rounds be odd"):
        stp.StepConfig(rounds=4)  # the median TTFT must be one round's, the one the clock draws


def test_int8_layers_show_as_their_own_part_for_the_prompt_only(lm):
    from dashboard.charts.stepthrough import RAN8, compute_cells

    n = 8
    cfg = stp.StepConfig(decode_steps=1, rounds=3, top_k=3, int8=(1, 2))
    rec = stp.record(lm, tiny_prompt(n), (4, 5), cfg)
    assert_grid_equals_counts(rec)
    pop = {s["stage"]: s for s in rec.steps if s["run"] == "pop"}
    prompt = list(range(n - 1))
    assert pop["prefill"]["int8"][1] == prompt and pop["prefill"]["int8"][2] == prompt
    assert pop["prefill"]["attention"][1] == [] and pop["prefill"]["int8"][3] == []
    assert pop["boundary"]["attention"][1] == [n - 1] and pop["boundary"]["int8"][1] == []
    assert all(row == [] for s in rec.steps if s["stage"].startswith("decode") for row in s["int8"])
    assert all(row == [] for s in rec.steps if s["run"] == "full" for row in s["int8"])
    assert compute_cells(pop["prefill"], 6, n)[1][:n - 1] == [RAN8] * (n - 1)
    assert rec.config["int8"] == [1, 2] or rec.config["int8"] == (1, 2)


def test_healing_steps_rewrite_the_pruned_layers_then_decode_reads_the_full_cache(lm):
    """Eager healing: one pass between the first token and decode step 1 re-runs the layers from
    the first skipped one up over every prompt position (the grid, the engine's counters and the
    frames agree), no token is picked there, the first token's time is not charged with it, and
    decode step 1 then sees what the full model's decode step 1 sees."""
    from pop_vllm.healing import make

    n, skip = 8, (3, 5)
    cfg = stp.StepConfig(decode_steps=2, rounds=3, top_k=3, heal=make("eager"))
    rec = stp.record(lm, tiny_prompt(n), skip, cfg)
    assert_grid_equals_counts(rec)
    pop = [s for s in rec.steps if s["run"] == "pop"]
    assert [s["stage"] for s in pop] == ["prefill", "boundary", "heal 1", "decode 1", "decode 2"]
    heal = pop[2]
    assert heal["attention"] == [[] for _ in range(3)] + [list(range(n))] * 3  # layers 3-5
    assert all(row == [] for row in heal["kv"]) and heal["token"] is None and heal["flops"] > 0
    assert_one_clock(rec)  # healing comes after the first token: not part of its time
    titles = [f["title"] for f in stp.frames(rec.steps)]
    assert titles[3] == ("Healing before decode step 1: layers 3-5 re-run on positions 1-8, "
                         "their K/V rewritten") and len(titles) == 6
    # decode step 1 after healing: the HF model's own next-token distribution for the prompt
    # and POP's first token (its cache is then the full model's for those tokens)
    with torch.inference_mode():
        ids = torch.tensor([rec.prompt_ids + [pop[1]["token"][0]]])  # (1, N+1)
        probs = torch.softmax(lm.model(ids).logits[0, -1].float(), -1)  # (V,)
    for tok, _, p in pop[3]["top"]:
        assert p == pytest.approx(float(probs[tok]), abs=1e-5)
    assert [t for t, _, _ in pop[3]["top"]] == probs.topk(3).indices.tolist()
    assert rec.config["heal"]["policy"] == "eager"
    assert "heal" not in stp.cache_params(lm, tiny_prompt(n), skip, CFG)["config"]


def test_a_healing_budget_spreads_the_passes_over_the_decode_steps(lm):
    from pop_vllm.healing import make

    n = 8
    cfg = stp.StepConfig(decode_steps=3, rounds=3, top_k=3, heal=make("budget", budget_positions=3))
    rec = stp.record(lm, tiny_prompt(n), (4, 5), cfg)
    assert_grid_equals_counts(rec)
    heals = [s for s in rec.steps if s["stage"].startswith("heal")]
    assert [s["stage"] for s in heals] == ["heal 1", "heal 2", "heal 3"]
    assert [s["attention"][4] for s in heals] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert all(len(s["times_ms"]) == 3 for s in heals)


def test_healing_options_a_step_through_cannot_show_are_refused_in_one_line(lm):
    from pop_vllm.errors import SettingError
    from pop_vllm.healing import make

    with pytest.raises(ValueError, match="not by milliseconds"):
        stp.StepConfig(heal=make("budget", budget_ms=5.0))
    cfg = stp.StepConfig(decode_steps=1, rounds=3, int8=(1,), heal=make("eager"))
    with pytest.raises(SettingError, match="healing re-runs the pruned layers in fp32"):
        stp.record(lm, tiny_prompt(6), (4, 5), cfg)
