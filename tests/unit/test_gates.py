"""Virtual gates on tiny random models: exact gradients, stage split, batching, hook hygiene."""
import pytest
import torch

from pop_analysis.importance.calibrate import (
    Batch,
    gate_gradients,
    pack,
    response_losses,
)
from pop_analysis.importance.gates import (
    DECODE,
    NONE,
    PREFILL,
    StageGates,
    block_influence,
    gated,
    stage_map,
)

from tiny import tiny_model, tiny_prompt

# HF's RMSNorm computes in float32 even for a float64 model, so a finite difference needs a step
# well above float32 rounding: central differences with EPS = 1e-3 err by O(EPS^2) + O(1e-7 / EPS).
EPS = 1e-3


@pytest.fixture(scope="module")
def lm64():
    """A tiny Llama in float64 (norms still round to float32)."""
    lm = tiny_model("llama", seed=3)
    lm.model.double()
    return lm


def loss_with(lm, batch: Batch, gates: StageGates | None = None) -> torch.Tensor:
    with torch.no_grad():
        if gates is None:
            return response_losses(lm, batch)
        with gated(lm.adapter, gates, batch.stages):
            return response_losses(lm, batch)


def ones(lm, n):
    return StageGates.ones(n, lm.adapter.n_layers, requires_grad=False, dtype=lm.dtype)


def test_stage_map_boundary_token_is_decode():
    codes = stage_map([4, 1], [7, 3], 8)
    assert codes[0].tolist() == [PREFILL] * 3 + [DECODE] * 3 + [NONE] * 2
    assert codes[1].tolist() == [DECODE] * 2 + [NONE] * 6  # one-token prompt: no prefill position
    with pytest.raises(ValueError):
        stage_map([0], [3], 4)
    with pytest.raises(ValueError):
        stage_map([2], [9], 4)


def test_gates_at_one_leave_the_loss_unchanged():
    lm = tiny_model("qwen3", seed=1)
    batch = pack([tiny_prompt(9, seed=2), tiny_prompt(4, seed=3)],
                 [tiny_prompt(5, seed=4), tiny_prompt(7, seed=5)])
    plain = loss_with(lm, batch)
    with_gates = loss_with(lm, batch, ones(lm, 2))
    assert torch.equal(plain, with_gates), f"max_diff {(plain - with_gates).abs().max()}"


def test_gradient_matches_finite_difference(lm64):
    batch = pack([tiny_prompt(7, seed=11)], [tiny_prompt(5, seed=12)])
    grads = gate_gradients(lm64, batch, influence=False)
    eps = EPS
    L = lm64.adapter.n_layers
    for stage in ("prefill", "decode"):
        for layer in range(L):
            vals = []
            for sign in (1.0, -1.0):
                g = ones(lm64, 1)
                getattr(g, stage)[0, layer] += sign * eps
                vals.append(loss_with(lm64, batch, g).double())
            fd = float((vals[0] - vals[1]) / (2 * eps))
            got = float(grads[stage][0, layer])
            assert got == pytest.approx(fd, rel=2e-3, abs=1e-4), f"{stage} L{layer}: {got} vs {fd}"


def test_boundary_token_feeds_the_decode_gate(lm64):
    """A one-token response is predicted from x_N alone: only the decode gates can move it."""
    batch = pack([tiny_prompt(6, seed=21)], [tiny_prompt(1, seed=22)])
    grads = gate_gradients(lm64, batch, influence=False)
    assert (grads["decode"][0] != 0).all(), grads["decode"]
    # Gating the boundary position alone reproduces the decode gradient of the last layer.
    L = lm64.adapter.n_layers
    eps = EPS
    vals = []
    for sign in (1.0, -1.0):
        g = ones(lm64, 1)
        g.decode[0, L - 1] += sign * eps
        vals.append(loss_with(lm64, batch, g))
    fd = float((vals[0] - vals[1]) / (2 * eps))
    assert float(grads["decode"][0, L - 1]) == pytest.approx(fd, rel=2e-3, abs=1e-4)


def test_one_token_prompt_has_zero_prefill_gradient(lm64):
    batch = pack([tiny_prompt(1, seed=31)], [tiny_prompt(6, seed=32)])
    grads = gate_gradients(lm64, batch)
    assert torch.count_nonzero(grads["prefill"]) == 0, grads["prefill"]
    assert torch.count_nonzero(grads["decode"]) > 0
    assert torch.count_nonzero(grads["bi_prefill"]) == 0  # no prefill positions to average


def test_last_layer_prefill_gradient_is_structurally_zero(lm64):
    """The last layer's prefill outputs reach no logit: only later positions' logits are scored."""
    batch = pack([tiny_prompt(8, seed=41)], [tiny_prompt(4, seed=42)])
    grads = gate_gradients(lm64, batch, influence=False)
    assert float(grads["prefill"][0, -1]) == 0.0
    assert (grads["prefill"][0, :-1] != 0).any()


def test_batched_equals_one_at_a_time(lm64):
    prompts = [tiny_prompt(n, seed=50 + n) for n in (1, 9, 4)]
    responses = [tiny_prompt(n, seed=60 + n) for n in (5, 2, 8)]
    together = gate_gradients(lm64, pack(prompts, responses))
    for b in range(3):
        alone = gate_gradients(lm64, pack([prompts[b]], [responses[b]]))
        for key in ("prefill", "decode", "loss", "bi_prefill", "bi_decode"):
            diff = (together[key][b] - alone[key][0]).abs().max()
            scale = alone[key][0].abs().max() + 1e-12
            assert diff / scale < 1e-9, f"sample {b} {key}: max_diff {diff}"


def test_block_influence_matches_hidden_states():
    lm = tiny_model("llama", seed=5)
    ids = torch.tensor([tiny_prompt(10, seed=7)])  # (1, T)
    with torch.no_grad(), block_influence(lm.adapter) as record:
        out = lm.model.model(input_ids=ids, output_hidden_states=True)
    hs = out.hidden_states  # L + 1 entries; the last is after the final norm
    for i in range(lm.adapter.n_layers - 1):
        want = 1 - torch.nn.functional.cosine_similarity(hs[i], hs[i + 1], dim=-1)  # (1, T)
        assert torch.allclose(record[i], want, atol=1e-6), f"layer {i}"
    assert all(0 <= float(v.min()) and float(v.max()) <= 2 for v in record.values())


def test_hooks_are_removed_even_on_error():
    lm = tiny_model("mistral", seed=2)
    batch = pack([tiny_prompt(5)], [tiny_prompt(3)])
    wrong = stage_map([2, 2], [4, 4], 4)  # two samples' stages for a one-sample batch
    with pytest.raises(ValueError, match="gate shape"):
        with gated(lm.adapter, ones(lm, 2), wrong), torch.no_grad():
            response_losses(lm, batch)
    with block_influence(lm.adapter), gated(lm.adapter, ones(lm, 1), batch.stages):
        pass
    assert not any(m._forward_hooks for m in lm.model.modules())


def test_gradient_pass_reports_each_layer_both_ways():
    lm = tiny_model("llama", seed=6)
    heard = []
    gate_gradients(lm, pack([tiny_prompt(4)], [tiny_prompt(3)]), tick=heard.append)
    L = lm.adapter.n_layers
    assert heard[:L] == [f"forward layer {i + 1}/{L}" for i in range(L)]
    assert heard[L:] == [f"backward layer {i}/{L}" for i in range(L, 0, -1)]
    assert not any(m._forward_hooks for m in lm.model.modules())


def tiny_gemma2():
    """A tiny Gemma-2 (eager attention, soft-capped logits, branch norms after each branch)."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    from pop_analysis.engine.models import model_from_hf

    from tiny import COMMON

    torch.manual_seed(0)
    config = Gemma2Config(**dict(COMMON, head_dim=16, sliding_window=8, query_pre_attn_scalar=16))
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).eval().double()
    return model_from_hf(model, name="tiny-gemma2")


def test_gemma_gates_act_on_the_normed_branches():
    lm = tiny_gemma2()
    prompts = [tiny_prompt(11, seed=71), tiny_prompt(3, seed=72)]
    responses = [tiny_prompt(4, seed=73), tiny_prompt(9, seed=74)]  # past the sliding window (8)
    batch = pack(prompts, responses)
    assert torch.equal(loss_with(lm, batch), loss_with(lm, batch, ones(lm, 2)))
    together = gate_gradients(lm, batch, influence=False)
    for b in range(2):
        alone = gate_gradients(lm, pack([prompts[b]], [responses[b]]), influence=False)
        diff = (together["decode"][b] - alone["decode"][0]).abs().max()
        assert diff < 1e-6 * alone["decode"][0].abs().max(), f"sample {b}: max_diff {diff}"
    single = pack(prompts[:1], responses[:1])
    g1 = gate_gradients(lm, single, influence=False)
    L = lm.adapter.n_layers
    for layer in (0, L - 2):
        vals = []
        for sign in (1.0, -1.0):
            g = ones(lm, 1)
            g.prefill[0, layer] += sign * EPS
            vals.append(loss_with(lm, single, g))
        fd = float((vals[0] - vals[1]) / (2 * EPS))
        assert float(g1["prefill"][0, layer]) == pytest.approx(fd, rel=2e-3, abs=1e-4)
        assert abs(fd) > 1e-3  # a scale before Gemma's branch norm would be normed away (~0)
