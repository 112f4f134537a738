"""POP runtime invariants on tiny random models of every supported family."""
import pytest
import torch

from pop_analysis.engine.counters import count_calls
from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.pop import LayerPlan, prefill, run_prompt
from pop_vllm.run_setting import RunSetting

from tiny import FAMILIES, tiny_model, tiny_prompt

GREEDY = SamplingConfig(max_new_tokens=12, stop_at_eos=False)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request):
    return tiny_model(request.param)


def hf_greedy(lm, ids, n):
    prompt = torch.tensor([ids])
    out = lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                            do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("variant", ["full", "pop", "pop_no_kv", "pop_no_boundary", "static"])
def test_empty_skip_equals_hf_generate(lm, variant):
    ids = tiny_prompt(10)
    ours = run(lm, ids, RunSetting((), variant), GREEDY).token_ids
    ref = hf_greedy(lm, ids, GREEDY.max_new_tokens)
    assert ours == ref, f"{variant} with no skip diverged from HF generate: {ours} vs {ref}"


def test_full_variant_ignores_skip_set(lm):
    ids = tiny_prompt(9)
    assert run(lm, ids, RunSetting((3, 4, 5), "full"), GREEDY).token_ids == hf_greedy(lm, ids, 12)


def test_every_layer_cache_same_length_after_pop_prefill(lm):
    ids = torch.tensor([tiny_prompt(11)])
    first = run_prompt(lm.adapter, ids, RunSetting((3, 4, 5)))
    lengths = [lm.adapter.cache_length(first.cache, i) for i in range(lm.adapter.n_layers)]
    assert lengths == [11] * lm.adapter.n_layers, lengths


def test_skipped_kv_is_projection_of_last_kept_output(lm):
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(11)])
    skip = (3, 4, 5)
    first = run_prompt(a, ids, RunSetting(skip))
    # Reference: the full model's hidden state after layer 2 (the last kept) at x_1..x_{N-1}.
    cache = a.new_cache()
    h = a.embed(ids[:, :-1])  # (1, N-1, D)
    pos = a.positions(0, 10)
    rope = a.rotary(h, pos)
    with torch.inference_mode():
        for i in range(3):
            h = a.run_layer(i, h, pos, rope, cache)
        for i in skip:
            k_ref, v_ref = a.project_kv(i, h, rope)
            k, v = a.cached_kv(first.cache, i)
            dk = (k[:, :, :10] - k_ref).abs().max().item()
            dv = (v[:, :, :10] - v_ref).abs().max().item()
            assert dk < 1e-5 and dv < 1e-5, f"layer {i}: max_diff k {dk} v {dv}"


def test_independent_k_equals_layers_own_k_path(lm):
    """project_kv reproduces what the layer's own attention caches for the same input."""
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(8)])
    h = a.embed(ids)
    pos = a.positions(0, 8)
    rope = a.rotary(h, pos)
    cache = a.new_cache()
    with torch.inference_mode():
        a.run_layer(0, h, pos, rope, cache)
        k_ref, v_ref = a.cached_kv(cache, 0)
        k, v = a.project_kv(0, h, rope)
    diff = max((k - k_ref).abs().max().item(), (v - v_ref).abs().max().item())
    assert diff < 1e-5, f"max_diff {diff}"


def test_pop_no_kv_leaves_skipped_prompt_entries_empty(lm):
    a = lm.adapter
    first = run_prompt(a, torch.tensor([tiny_prompt(11)]), RunSetting((4, 5), "pop_no_kv"))
    # Only the boundary token x_N reached the skipped layers' caches.
    assert [a.cache_length(first.cache, i) for i in (4, 5)] == [1, 1]
    assert a.cache_length(first.cache, 3) == 11


def test_boundary_logits_come_from_full_stack(lm):
    """With boundary handling, x_N's logits equal a full forward of x_N over the POP cache."""
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(11)])
    skip = (3, 4, 5)
    first = run_prompt(a, ids, RunSetting(skip))
    cache = a.new_cache()
    prefill(a, ids[:, :-1], cache, LayerPlan(skip, "kv"))
    with count_calls(a) as calls:
        h = prefill(a, ids[:, -1:], cache, start=10)  # x_N through every layer
    ref = a.logits(h)[:, -1].float()
    assert calls.as_dict()["prefill"]["ffn"] == [1] * a.n_layers
    diff = (first.logits - ref).abs().max().item()
    assert diff < 1e-5, f"max_diff {diff}"
    # Without boundary handling x_N skips the block, so its logits differ.
    no_b = run_prompt(a, ids, RunSetting(skip, "pop_no_boundary")).logits
    assert (no_b - ref).abs().max().item() > 1e-3


def test_call_counters_show_skipped_layers_ran_no_attention_or_ffn(lm):
    a = lm.adapter
    skip = (3, 4, 5)
    with count_calls(a) as calls:
        calls.stage = "prefill"
        prefill(a, torch.tensor([tiny_prompt(10)]), a.new_cache(), LayerPlan(skip, "kv"))
    c = calls.as_dict()["prefill"]
    assert c["attention"] == [1, 1, 1, 0, 0, 0]
    assert c["ffn"] == [1, 1, 1, 0, 0, 0]
    assert c["k_proj"] == [1] * 6  # skipped layers still project K (and V)


def test_static_variant_drops_layers_in_decode_too(lm):
    a = lm.adapter
    ids = tiny_prompt(10)
    with count_calls(a) as calls:
        run(lm, ids, RunSetting((4, 5), "static"),
            SamplingConfig(max_new_tokens=3, stop_at_eos=False), counts=calls)
    c = calls.as_dict()
    assert c["prefill"]["attention"] == [1, 1, 1, 1, 0, 0]
    assert c["decode"]["attention"] == [2, 2, 2, 2, 0, 0]


def test_pop_counts_per_stage(lm):
    a = lm.adapter
    with count_calls(a) as calls:
        run(lm, tiny_prompt(10), RunSetting((4, 5)),
            SamplingConfig(max_new_tokens=3, stop_at_eos=False), counts=calls)
    c = calls.as_dict()
    assert c["prefill"]["ffn"] == [1, 1, 1, 1, 0, 0] and c["prefill"]["k_proj"] == [1] * 6
    # x_N shares layers 0-3 with the prompt's pass (their inputs are identical in both paths),
    # then runs every layer from the first skipped one on in full.
    assert c["boundary"]["ffn"] == [0, 0, 0, 0, 1, 1]
    assert c["decode"]["ffn"] == [2] * 6


def test_sampling_is_seeded_and_top_p_restricts(lm):
    ids = tiny_prompt(10)
    cfg = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7, stop_at_eos=False)
    a = run(lm, ids, RunSetting((4, 5)), cfg).token_ids
    b = run(lm, ids, RunSetting((4, 5)), cfg).token_ids
    assert a == b
    tiny_p = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=3, stop_at_eos=False)
    pop = RunSetting((4, 5))
    assert run(lm, ids, pop, tiny_p).token_ids == run(lm, ids, pop, GREEDY).token_ids[:8]


def test_one_token_prompt_runs_every_variant(lm):
    for v in ("full", "pop", "pop_no_kv", "pop_no_boundary", "static"):
        out = run(lm, [5], RunSetting((4, 5), v),
                  SamplingConfig(max_new_tokens=3, stop_at_eos=False))
        assert len(out.token_ids) == 3


def test_teacher_forced_chunk_equals_step_by_step(lm):
    """A multi-token chunk after a POP prompt gives the same logits as one token at a time."""
    from pop_analysis.engine.pop import decode_step, teacher_force

    a = lm.adapter
    ids = torch.tensor([tiny_prompt(10)])
    cont = torch.tensor([tiny_prompt(5, seed=9)])
    for variant in ("pop", "pop_no_kv"):
        first = run_prompt(a, ids, RunSetting((3, 4, 5), variant))
        chunk = teacher_force(a, cont, first.cache, first.position)  # (1, 5, V)
        second = run_prompt(a, ids, RunSetting((3, 4, 5), variant))
        steps = [decode_step(a, cont[:, t:t + 1], second.cache, second.position + t)
                 for t in range(5)]
        diff = (chunk[0] - torch.cat(steps)).abs().max().item()
        assert diff < 1e-4, f"{variant}: max_diff {diff}"
