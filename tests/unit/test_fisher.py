"""The one-pass sampler + gate gradients (fisher.py) against the teacher-forced reference, on every
family in float64; the pieces it rests on: few-row linears, forked preallocated caches, head_vjp."""
import pytest
import torch
from test_families import RUNNER, build

from pop_analysis.engine.generate import SamplingConfig
from pop_analysis.engine.generate import run as run_generation
from pop_analysis.importance.calibrate import (
    CalibrationConfig,
    calibrate_ids,
    gate_gradients,
    pack,
    response_losses,
    sample_responses,
    sample_seed,
)
from pop_analysis.importance.fewrows import ROWS, few_rows
from pop_analysis.importance.fisher import sample_and_gradients
from pop_analysis.importance.gates import StageGates, gated
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

PROMPTS = [tiny_prompt(n, seed=80 + n) for n in (1, 14, 4, 9)]  # 14 > the sliding window (8)
SEEDS = [5, 6, 7, 8]
CFG = CalibrationConfig(max_new_tokens=11)


def fused(lm, prompts=PROMPTS, seeds=SEEDS, cfg=CFG):
    gates = StageGates.ones(len(prompts), lm.adapter.n_layers, dtype=lm.dtype)
    responses, extra = sample_and_gradients(lm, prompts, seeds, cfg, gates, influence=True)
    return responses, {"prefill": gates.prefill.grad, "decode": gates.decode.grad, **extra}


def with_eos_mid_response(lm):
    """Make a token that one row samples mid-way an EOS, so responses end at different lengths."""
    free, _ = fused(lm)
    lm.model.config.eos_token_id = free[1][3]
    lm.model.generation_config.eos_token_id = None
    return free


@pytest.mark.parametrize("family", sorted(RUNNER))
def test_fused_gradients_equal_teacher_forced(family):
    """float64 where HF allows it: eager attention takes its softmax in float32, where a float64
    mask's minimum becomes -inf and a left-pad query that sees no key gives NaN; eager families
    run in float32 (the two paths then differ by about 1e-6 of the largest value)."""
    lm = build(family, seed=1)
    eager = RUNNER[family][1] == "eager"
    tol = 1e-4 if eager else 1e-6
    if not eager:
        lm.model.double()
    with_eos_mid_response(lm)
    responses, got = fused(lm)
    lengths = [len(r) for r in responses]
    assert min(lengths) < CFG.max_new_tokens == max(lengths), lengths  # right padding exercised
    assert responses == sample_responses(lm, PROMPTS, SEEDS, CFG)  # the same tokens, gates or not
    want = gate_gradients(lm, pack(PROMPTS, responses))
    for key in ("prefill", "decode", "loss", "bi_prefill", "bi_decode"):
        diff = (got[key].cpu() - want[key]).abs().max()
        scale = want[key].abs().max()
        assert scale > 0, f"{family} {key}: all zero"
        assert diff <= tol * scale, f"{family} {key}: max_diff {diff} (scale {scale})"
    assert torch.count_nonzero(got["prefill"][0]) == 0  # one-token prompt: no prefill position
    assert not any(m._forward_hooks for m in lm.model.modules())


def test_fused_batch_equals_one_at_a_time():
    lm = tiny_model("qwen3", seed=8)
    lm.model.double()
    responses, together = fused(lm)
    for b in range(len(PROMPTS)):
        alone_r, alone = fused(lm, PROMPTS[b:b + 1], SEEDS[b:b + 1])
        assert alone_r[0] == responses[b]
        for key in ("prefill", "decode", "loss"):
            diff = (together[key][b] - alone[key][0]).abs().max()
            assert diff <= 1e-6 * (alone[key][0].abs().max() + 1e-12), f"row {b} {key}: {diff}"


def test_sampling_only_builds_no_graph():
    lm = tiny_model("llama", seed=2)
    responses, extra = sample_and_gradients(lm, PROMPTS, SEEDS, CFG)
    assert extra == {} and [len(r) for r in responses] == [CFG.max_new_tokens] * len(PROMPTS)


@pytest.mark.parametrize("rows", [min(ROWS), 16, max(ROWS), max(ROWS) + 1, 3])
def test_few_row_linears_equal_plain_ones(rows):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(64, 96)
    x = torch.randn(rows, 1, 64)  # (B, 1, D): a decode step's rows
    want = layer(x)
    with few_rows(layer):
        got = layer(x)
        assert "forward" in vars(layer)
    assert "forward" not in vars(layer)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_forked_cache_steps_equal_the_plain_cache():
    """A fork (preallocated full-attention layers, copied sliding layers) decodes as the original
    would, past its capacity, and leaves the original untouched."""
    lm = build("gemma3_text", seed=3)  # sliding and global layers
    a = lm.adapter
    ids = torch.tensor([tiny_prompt(12, seed=4), tiny_prompt(12, seed=5)])  # (2, 12)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = a.new_cache()
        a.forward_padded(ids, mask, None, plain)
        before = [(k.clone(), v.clone()) for k, v in (a.cached_kv(plain, i) for i in range(a.n_layers))]
        fork = a.fork_cache(plain, capacity=13)  # grows after one step
        reference = a.new_cache()
        a.forward_padded(ids, mask, None, reference)
        for t in range(5):
            tok = torch.tensor([[3 + t], [7 + t]])  # (2, 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = torch.full((2, 1), 12 + t)
            got = a.forward_padded(tok, mask, pos, fork)
            want = a.forward_padded(tok, mask, pos, reference)
            assert torch.allclose(got, want, atol=1e-6), f"step {t}: {(got - want).abs().max()}"
    for i, (k, v) in enumerate(before):
        assert torch.equal(a.cached_kv(plain, i)[0], k) and torch.equal(a.cached_kv(plain, i)[1], v)


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # gemma2 soft-caps its logits
def test_head_vjp_equals_autograd(family):
    lm = build(family, seed=6)
    lm.model.double()
    h = torch.randn(5, 64, dtype=torch.float64, requires_grad=True)
    logits = lm.adapter.head(h)  # (5, V)
    grad = torch.randn_like(logits)
    (want,) = torch.autograd.grad(logits, h, grad)
    with torch.no_grad():
        got = lm.adapter.head_vjp(lm.adapter.logit_grad(logits, grad))
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def previous_algorithm(lm, prompts, cfg):
    """What calibration computed before the one-pass path: each response sampled by batch-1
    generation with the sample's own seed, then one teacher-forced gated forward + backward over
    [prompt ; response] (calibrate.gate_gradients). Squared gradients per sample and layer."""
    responses = [run_generation(lm, p, RunSetting.full(), cfg=SamplingConfig(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        seed=sample_seed(cfg.seed, i))).token_ids for i, p in enumerate(prompts)]
    g = gate_gradients(lm, pack(prompts, responses))
    return responses, g


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_calibration_scores_equal_the_previous_algorithm(family):
    """End to end (calibrate_ids, batches of 3 sorted by length) against the previous algorithm,
    in float64: the same responses, per-sample scores, block influence and losses."""
    lm = tiny_model(family, seed=12)
    lm.model.double()
    prompts = [tiny_prompt(n, seed=90 + n) for n in (6, 1, 13, 3, 9)]
    cfg = CalibrationConfig(n_samples=5, max_new_tokens=9, seed=4, batch_size=3)
    got = calibrate_ids(lm, prompts, cfg)
    responses, want = previous_algorithm(lm, prompts, cfg)
    assert got.response_tokens == [len(r) for r in responses]
    for stage in ("prefill", "decode"):
        new = torch.tensor(getattr(got, f"{stage}_samples"), dtype=torch.float64)  # (n, L)
        old = want[stage].double() ** 2  # (n, L)
        assert old.abs().max() > 0
        assert torch.allclose(new, old, rtol=1e-6, atol=1e-12 * old.abs().max()), \
            f"{stage}: max_diff {(new - old).abs().max()} (scale {old.abs().max()})"
        bi = torch.tensor(got.block_influence[stage], dtype=torch.float64)  # (L,)
        assert torch.allclose(bi, want[f"bi_{stage}"].double().mean(0), rtol=1e-6, atol=1e-12)
    assert torch.allclose(torch.tensor(got.loss, dtype=torch.float64), want["loss"].double(),
                          rtol=1e-9)


def test_fused_gradients_equal_finite_differences():
    """dL/dg of the one-pass path against central differences of the response loss, every layer
    and stage (float64 model; HF's norms still round to float32, hence EPS = 1e-3)."""
    lm = tiny_model("llama", seed=13)
    lm.model.double()
    prompts, seeds = [tiny_prompt(7, seed=14)], [15]
    got = fused(lm, prompts, seeds, CalibrationConfig(max_new_tokens=5))[1]
    responses = sample_responses(lm, prompts, seeds, CalibrationConfig(max_new_tokens=5))
    batch = pack(prompts, responses)
    L, eps = lm.adapter.n_layers, 1e-3
    for stage in ("prefill", "decode"):
        for layer in range(L):
            vals = []
            for sign in (1.0, -1.0):
                g = StageGates.ones(1, L, requires_grad=False, dtype=lm.dtype)
                getattr(g, stage)[0, layer] += sign * eps
                with torch.no_grad(), gated(lm.adapter, g, batch.stages):
                    vals.append(float(response_losses(lm, batch)[0]))
            fd = (vals[0] - vals[1]) / (2 * eps)
            assert float(got[stage][0, layer]) == pytest.approx(fd, rel=2e-3, abs=1e-4), \
                f"{stage} L{layer}"


def test_fused_loss_is_the_ungated_loss_and_gates_must_be_one():
    """Gates at 1 change nothing: the loss the one-pass path reports is the plain model's
    cross-entropy of its own responses; any other gate value is refused."""
    lm = tiny_model("qwen2", seed=16)
    lm.model.double()
    responses, got = fused(lm)
    with torch.no_grad():
        plain = response_losses(lm, pack(PROMPTS, responses))  # no hooks at all
    assert torch.allclose(got["loss"].double(), plain, rtol=1e-9)
    gates = StageGates.ones(len(PROMPTS), lm.adapter.n_layers, dtype=lm.dtype)
    with torch.no_grad():
        gates.decode[0, 2] = 0.5
    with pytest.raises(ValueError, match="gates = 1"):
        sample_and_gradients(lm, PROMPTS, SEEDS, CFG, gates)


def test_fused_boundary_token_counts_as_decode():
    """One-token prompts: the only prompt token is the boundary x_N, a decode position, so the
    prefill gates get no gradient and no block influence; a two-token prompt has one prefill
    position, whose gradient equals the teacher-forced one."""
    lm = tiny_model("llama", seed=17)
    lm.model.double()
    prompts = [tiny_prompt(1, seed=18), tiny_prompt(2, seed=19)]
    responses, got = fused(lm, prompts, [1, 2], CalibrationConfig(max_new_tokens=4))
    assert torch.count_nonzero(got["prefill"][0]) == 0
    assert torch.count_nonzero(got["bi_prefill"][0]) == 0
    assert torch.count_nonzero(got["decode"][0]) > 0 and torch.count_nonzero(got["prefill"][1]) > 0
    want = gate_gradients(lm, pack(prompts, responses))
    for key in ("prefill", "decode"):
        assert torch.allclose(got[key], want[key], rtol=1e-6, atol=1e-12), key
