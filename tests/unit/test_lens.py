"""Logit lens on tiny random models: the last layer's lens is the model's own output."""
import pytest
import torch

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.pop import decode_step, run_prompt
from pop_analysis.inspection import lens
from pop_vllm.run_setting import RunSetting

from tiny import FAMILIES, tiny_model, tiny_prompt

SKIP = (3, 4)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request):
    return tiny_model(request.param)


def own_logits(lm, prompt, generated, variant, skip) -> torch.Tensor:
    """The logits the model itself produced step by step while generating: (T, V)."""
    a = lm.adapter
    first = run_prompt(a, torch.tensor([prompt]), RunSetting(skip, variant))
    out, pos = [first.logits[0]], first.position
    drop = tuple(skip) if variant == "static" else ()
    for tok in generated[:-1]:
        out.append(decode_step(a, torch.tensor([[tok]]), first.cache, pos, drop)[0])
        pos += 1
    return torch.stack(out).float()  # (T, V)


@pytest.mark.parametrize("variant", ["full", "pop", "static"])
def test_last_layer_lens_is_the_models_own_output(lm, variant):
    prompt = tiny_prompt(10)
    skip = () if variant == "full" else SKIP
    gen = run(lm, prompt, RunSetting(skip, variant), SamplingConfig(max_new_tokens=6)).token_ids
    states = lens.layer_states(lm.adapter, prompt, gen, RunSetting(skip, variant))  # (L, T, D)
    assert states.shape == (lm.adapter.n_layers, len(gen), lm.adapter.shape.hidden)
    mine = lm.adapter.logits(states[-1][None]).float()[0]  # (T, V)
    want = own_logits(lm, prompt, gen, variant, skip)
    d = (mine - want).abs().max().item()
    assert d < 1e-4, f"max_diff {d}"
    t = lens.trace(lm, prompt, gen, RunSetting(skip, variant))
    assert [c[0][0] for c in t.topk] == gen, "greedy tokens are the top-1 of the last layer"
    assert all(c is not None and 0 <= c < lm.adapter.n_layers for c in t.commit)
    assert all(f <= c for f, c in zip(t.first_top1, t.commit))
    assert len(t.prob) == lm.adapter.n_layers and len(t.prob[0]) == len(gen)
    assert abs(t.topk[0][0][1] - torch.softmax(want[0], -1).max().item()) < 1e-5


def test_pop_with_no_skipped_layer_traces_like_full(lm):
    prompt, gen = tiny_prompt(9, seed=3), [5, 17, 80, 2]
    a = lens.layer_states(lm.adapter, prompt, gen, RunSetting.full())
    b = lens.layer_states(lm.adapter, prompt, gen, RunSetting(()))
    d = (a - b).abs().max().item()
    assert d < 1e-5, f"max_diff {d}"


def test_dropped_layers_pass_their_input_on():
    lm = tiny_model("llama")
    states = lens.layer_states(lm.adapter, tiny_prompt(8), [1, 2, 3], RunSetting(SKIP, "static"))
    for i in SKIP:
        assert torch.equal(states[i], states[i - 1]), f"layer {i} ran though it was dropped"


def test_hooks_are_removed():
    lm = tiny_model("qwen3")
    lens.trace(lm, tiny_prompt(6), [1, 2], RunSetting(SKIP))
    assert all(not layer._forward_hooks for layer in lm.adapter.layers)


def test_commit_and_first_layer():
    t = torch.tensor
    assert lens.commit_layer(t([False, True, False, True, True])) == 3
    assert lens.first_layer(t([False, True, False, True, True])) == 1
    assert lens.commit_layer(t([True, True])) == 0
    assert lens.commit_layer(t([True, False])) is None, "not the model's own choice"
    assert lens.first_layer(t([False, False])) is None


def test_trace_limits_tokens_and_rejects_nothing():
    lm = tiny_model("llama")
    t = lens.trace(lm, tiny_prompt(5), list(range(1, 11)), RunSetting.full(), max_tokens=4)
    assert t.tokens == [1, 2, 3, 4] and len(t.topk) == 4
    with pytest.raises(ValueError, match="nothing generated"):
        lens.trace(lm, tiny_prompt(5), [], RunSetting.full())
