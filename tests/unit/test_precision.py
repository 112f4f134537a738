"""Stage-aware precision on tiny random models: int8 prompt layers, fp32 decode.

Each configuration's first-token logits are checked against a direct computation (HF's own
forward over a model whose layers are swapped for the int8 copies, or an explicit layer loop), and
decode is checked to be the full model's, bit for bit, given the same prompt cache.
"""
import copy

import pytest
import torch
from transformers import DynamicCache

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.int8 import int8_layers, memory, quantize_layer
from pop_analysis.engine.pop import decode_step, run_prompt
from pop_analysis.engine.precision import (Precision, PrecisionError, decode_twins, layer_plan,
                                           plan_code)

from tiny import FAMILIES, tiny_model, tiny_prompt
from pop_vllm.run_setting import RunSetting

ATOL = 1e-4  # different chunkings of the same fp32 math (N-1 + 1 positions vs N at once)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request):
    return tiny_model(request.param)


def ids_of(n=11, seed=1):
    return torch.tensor([tiny_prompt(n, seed)])  # (1, N)


def swapped(lm, layers):
    """A copy of the HF model whose `layers` are int8 copies (quantised as the engine does)."""
    model = copy.deepcopy(lm.model)
    stack = getattr(model.model, "language_model", model.model).layers
    for i in layers:
        stack[i] = quantize_layer(lm.adapter.layers[i])
    return model


@torch.inference_mode()
def hf_two_stage(prompt_model, full_model, ids):
    """The prompt x_1..x_{N-1} through `prompt_model`, x_N through `full_model`, HF's forwards."""
    cache = DynamicCache(config=full_model.config)
    prompt_model(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True)
    n = ids.shape[1]
    out = full_model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True,
                     position_ids=torch.tensor([[n - 1]]))
    return out.logits[:, -1].float(), cache  # (1, V)


def test_no_int8_layers_is_bit_identical_to_fp32(lm):
    ids = ids_of()
    a = run_prompt(lm.adapter, ids, RunSetting((4, 5))).logits
    b = run_prompt(lm.adapter, ids, RunSetting((4, 5), precision=Precision())).logits
    assert torch.equal(a, b)


def test_prefill_int8_alone_matches_hf_two_stage_forward(lm):
    ids, layers = ids_of(), (1, 2, 3)
    ours = run_prompt(lm.adapter, ids, RunSetting.full().replace(precision=Precision(layers))).logits
    ref, _ = hf_two_stage(swapped(lm, layers), lm.model, ids)
    full = run_prompt(lm.adapter, ids, RunSetting.full()).logits
    diff = (ours - ref).abs().max().item()
    assert diff < ATOL, f"int8 prefill vs HF forward of the int8 model: max_diff {diff}"
    assert (ours - full).abs().max().item() > 10 * ATOL, "int8 layers changed nothing"


def test_uniform_int8_matches_hf_int8_model_in_prompt_and_decode(lm):
    ids, every = ids_of(9), tuple(range(lm.adapter.n_layers))
    prec = Precision(every, decode_int8=True)
    model = swapped(lm, every)
    with torch.inference_mode():
        ref = model(input_ids=ids).logits[:, -1].float()
    ours = run_prompt(lm.adapter, ids, RunSetting.full().replace(precision=prec)).logits
    assert (ours - ref).abs().max().item() < ATOL
    cfg = SamplingConfig(max_new_tokens=8, stop_at_eos=False)
    toks = run(lm, ids[0].tolist(), RunSetting.full().replace(precision=prec), cfg).token_ids
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                        do_sample=False, eos_token_id=None, pad_token_id=0)[0, 9:].tolist()
    assert toks == hf


@torch.inference_mode()
def test_pop_with_int8_matches_an_explicit_layer_loop(lm):
    a, ids = lm.adapter, ids_of()
    skip, int8 = (4, 5), (1, 2)
    first = run_prompt(a, ids, RunSetting(skip, precision=Precision(int8)))
    twins = int8_layers(a, int8)
    cache = a.new_cache()
    n = ids.shape[1]
    h, pos = a.embed(ids[:, :-1]), a.positions(0, n - 1)  # (1, N-1, D), (1, N-1)
    rope = a.rotary(h, pos)
    for i in range(a.n_layers):  # the prompt: fp32, int8 or K/V only
        if i in skip:
            a.write_kv(cache, i, *a.project_kv(i, h, rope))
        else:
            h = a.run_layer(i, h, pos, rope, cache, a.layer_mask(i, cache, n - 1), twins.get(i))
    x, pos = a.embed(ids[:, -1:]), a.positions(n - 1, 1)  # x_N through every fp32 layer
    rope = a.rotary(x, pos)
    for i in range(a.n_layers):
        x = a.run_layer(i, x, pos, rope, cache)
    ref = a.logits(x)[:, -1].float()
    assert (first.logits - ref).abs().max().item() < ATOL
    lengths = {a.cache_length(first.cache, i) for i in range(a.n_layers)}
    assert lengths == {n}, f"every layer's cache holds the prompt: {lengths}"


@torch.inference_mode()
def test_decode_is_the_full_models_bit_for_bit_given_the_same_cache(lm):
    a, ids = lm.adapter, ids_of()
    prec = Precision((0, 1, 2))
    first = run_prompt(a, ids, RunSetting((5,), precision=prec))
    ours, full, hf = (copy.deepcopy(first.cache) for _ in range(3))
    nxt, pos = first.logits.argmax(-1, keepdim=True), first.position  # (1, 1)
    for _ in range(6):
        got = decode_step(a, nxt, ours, pos, twins=decode_twins(a, prec))  # the run's decode
        want = decode_step(a, nxt, full, pos)  # the full model's decode
        assert torch.equal(got, want), f"max_diff {(got - want).abs().max().item()}"
        ref = lm.model(input_ids=nxt, past_key_values=hf, use_cache=True,
                       position_ids=torch.tensor([[pos]])).logits[:, -1].float()  # HF, fp32
        assert (got - ref).abs().max().item() < ATOL
        nxt, pos = got.argmax(-1, keepdim=True), pos + 1


def test_no_int8_module_runs_after_the_prompt(lm):
    a, prec = lm.adapter, Precision((0, 2))
    calls = []
    twins = int8_layers(a, prec.int8)
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in twins.values()]
    try:
        cfg = SamplingConfig(max_new_tokens=6, stop_at_eos=False)
        ran = []
        for tok in __import__("pop_analysis.engine.generate", fromlist=["generate"]).generate(
                lm, tiny_prompt(10), RunSetting((5,), precision=prec), cfg):
            ran.append(len(calls))
    finally:
        for h in handles:
            h.remove()
    assert ran[0] == 2, f"each int8 layer runs once for the prompt: {ran}"
    assert ran[-1] == 2, f"int8 layers ran during decode: {ran}"


def test_generation_decodes_with_the_original_weights(lm):
    """Decode after an int8 prompt equals the full model's decode from that same cache."""
    a, prompt = lm.adapter, tiny_prompt(10)
    prec = Precision((1, 3))
    cfg = SamplingConfig(max_new_tokens=8, stop_at_eos=False)
    toks = run(lm, prompt, RunSetting((5,), precision=prec), cfg).token_ids
    with torch.inference_mode():
        first = run_prompt(a, torch.tensor([prompt]), RunSetting((5,), precision=prec))
        nxt, pos, cache, ref = first.logits.argmax(-1, keepdim=True), first.position, first.cache, []
        for _ in range(8):
            ref.append(int(nxt))
            logits = decode_step(a, nxt, cache, pos)  # the full model's decode, no int8 anywhere
            nxt, pos = logits.argmax(-1, keepdim=True), pos + 1
    assert toks == ref


def test_int8_copies_leave_the_fp32_model_untouched(lm):
    a, ids = lm.adapter, ids_of()
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    ref = run_prompt(a, ids, RunSetting.full()).logits
    run_prompt(a, ids, RunSetting.full().replace(precision=Precision(tuple(range(a.n_layers)))))
    after = lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(run_prompt(a, ids, RunSetting.full()).logits, ref)
    mem = memory(a)
    assert mem["int8_layers"] == a.n_layers
    assert 0 < mem["int8_bytes"] < 0.45 * sum(p.numel() * 4 for p in a.layers[0].parameters()) * \
        a.n_layers, mem


@pytest.mark.parametrize("variant, skip, prec, says", [
    ("pop", (4, 5), Precision((3, 4)), "layer(s) 4 both skipped and int8"),
    ("pop", (5,), Precision((6,)), "int8 layer(s) 6 out of range"),
    ("pop_no_kv", (5,), Precision((1,)), "int8 layers combine with variants full and pop"),
    ("pop", (5,), Precision((1,), decode_int8=True), "int8 decode (uniform int8) is a baseline"),
])
def test_bad_combinations_are_refused_in_one_line(lm, variant, skip, prec, says):
    with pytest.raises(PrecisionError) as e:
        run_prompt(lm.adapter, ids_of(), RunSetting(skip, variant, precision=prec))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_decode_int8_without_layers_and_bad_layers_are_refused():
    with pytest.raises(PrecisionError, match="needs int8 layers"):
        Precision((), decode_int8=True)
    with pytest.raises(PrecisionError, match="list of layer indices"):
        Precision(("a",))


def test_a_bfloat16_model_has_no_int8_path():
    lm = tiny_model("llama")
    lm.model.to(torch.bfloat16)
    with pytest.raises(PrecisionError, match="quantises float32 weights; this model is bfloat16"):
        run_prompt(lm.adapter, ids_of(), RunSetting.full().replace(precision=Precision((1,))))


def test_layer_plan_codes():
    plan = layer_plan(6, RunSetting((4, 5), precision=Precision((0, 1))))
    assert plan == ["int8", "int8", "full", "full", "skip", "skip"]
    assert plan_code(plan) == "IIFFSS"
    assert layer_plan(3, RunSetting((2,), "full")) == ["full"] * 3


def test_copies_built_under_hooks_inherit_none():
    lm = tiny_model("llama", seed=3)
    calls = []
    handle = lm.adapter.attention(2).register_forward_hook(lambda *_: calls.append(1))
    try:
        run_prompt(lm.adapter, ids_of(),
                   RunSetting.full().replace(precision=Precision((2,))))  # builds the copy
    finally:
        handle.remove()
    assert calls == [1], f"the fp32 layer runs x_N once; its int8 copy carries no hook: {calls}"
