"""Importance methods on tiny random models: each metric against a hand computation, the
invariants of planted identity layers (a block whose residual branches are zeroed), agreement."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau, spearmanr

from pop_analysis.experiments.methods_run import (
    ImportanceConfig,
    ImportanceResult,
    drop_one,
    run_importance,
)
from pop_analysis.experiments.methods_store import check_result
from pop_analysis.importance.calibrate import gate_gradients, pack, sample_responses, sample_seed
from pop_analysis.importance.compare import agreement, kendall_tau_b, spearman_rho
from pop_analysis.importance.hooks_pass import forward_metrics
from pop_analysis.importance.methods import METHODS, MethodError, parse_methods
from pop_analysis.quality.metrics import continuation_nll, greedy_tokens
from pop_analysis.store.records import RecordError
from pop_vllm.run_setting import RunSetting

from tiny import planted_model, tiny_model, tiny_prompt

PLANTED = (1, 3)  # identity blocks of the 6-layer model (tiny.planted_model)
PROMPTS = [tiny_prompt(n, seed=n) for n in (5, 9, 3, 12, 7, 6)]
MEASURED = ("gate", "taylor", "bi", "angular", "sublayer", "magnitude", "dropone")


@pytest.fixture(scope="module")
def lm():
    return planted_model(PLANTED)


@pytest.fixture(scope="module")
def result(lm):
    return run_importance(lm, PROMPTS, ImportanceConfig(n_samples=6, new_tokens=4, resamples=200))


def _by_hand(lm, prompt):
    """Layer inputs, attention branch outputs and layer outputs of one prompt, by plain hooks."""
    got = {"x": {}, "a": {}, "y": {}}

    def layer_hook(i):
        def fn(m, args, kw, out):
            got["x"][i] = args[0] if args else kw["hidden_states"]
            got["y"][i] = out[0] if isinstance(out, tuple) else out
        return fn

    def attn_hook(i):
        def fn(m, args, out):
            got["a"][i] = out[0]
        return fn

    hooks = []
    for i, layer in enumerate(lm.adapter.layers):
        hooks.append(layer.register_forward_hook(layer_hook(i), with_kwargs=True))
        hooks.append(layer.self_attn.register_forward_hook(attn_hook(i)))
    try:
        with torch.no_grad():
            lm.model(torch.tensor([prompt]))
    finally:
        for h in hooks:
            h.remove()
    return {k: {i: v[0].double() for i, v in d.items()} for k, d in got.items()}  # (T, D) each


def test_every_hook_metric_matches_a_hand_computation():
    lm = tiny_model("qwen3", seed=2)
    got = forward_metrics(lm, PROMPTS[:4], rows=3)  # two batches of unequal lengths, padded
    cos = torch.nn.functional.cosine_similarity
    for b, prompt in enumerate(PROMPTS[:4]):
        h = _by_hand(lm, prompt)
        L, pre = lm.adapter.n_layers, slice(0, len(prompt) - 1)
        for i in range(L):
            x, a, y = h["x"][i], h["a"][i], h["y"][i]
            want = {"bi.prefill": (1 - cos(x, y))[pre].mean(), "bi.decode": (1 - cos(x, y))[-1],
                    "sublayer.attention": (1 - cos(x, x + a))[pre].mean(),
                    "sublayer.mlp": (1 - cos(x + a, y))[pre].mean(),
                    "magnitude.prefill": ((y - x).norm(dim=-1) / y.norm(dim=-1))[pre].mean(),
                    "magnitude.decode": (y - x).norm(dim=-1)[-1] / y.norm(dim=-1)[-1]}
            for key, value in want.items():
                assert float(got[key][b, i]) == pytest.approx(float(value), rel=1e-4, abs=1e-6), \
                    f"{key} layer {i} sample {b}: max_diff {abs(float(got[key][b, i]) - float(value))}"
            states = [h["x"][0][-1]] + [h["y"][j][-1] for j in range(L)]  # h_0 .. h_L, last token
            for n in range(1, L - i + 1):
                c = float(cos(states[i], states[i + n], dim=0).clamp(-1, 1))
                assert float(got["triangle"][b, i, n - 1]) == pytest.approx(
                    math.acos(c) / math.pi, abs=2e-4), f"d({i}, {n}) sample {b}"
        assert torch.equal(got["angular.last"][b], got["triangle"][b, :, 0])


def test_gate_taylor_is_the_mean_absolute_gate_gradient(lm):
    prompts = PROMPTS[:3]
    res = run_importance(lm, prompts, ImportanceConfig(methods=("gate", "taylor"), n_samples=3,
                                                       new_tokens=4, resamples=0))
    cfg = res.config
    responses = sample_responses(lm, prompts, [sample_seed(cfg["seed"], i) for i in range(3)],
                                 type("C", (), {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0})())
    grads = gate_gradients(lm, pack(prompts, responses), influence=False)
    for stage in ("prefill", "decode"):
        hand = grads[stage].double().abs().mean(0)  # (L,)
        got = torch.tensor(res.series[f"taylor.{stage}"], dtype=torch.float64)
        assert torch.allclose(got, hand, rtol=1e-4, atol=1e-6), f"{stage}: max_diff {(got - hand).abs().max()}"
        assert torch.allclose(torch.tensor(res.series[f"gate.{stage}"], dtype=torch.float64),
                              grads[stage].double().pow(2).mean(0), rtol=1e-4, atol=1e-6)


def test_drop_one_equals_a_direct_pop_run_of_each_layer(lm):
    prompt = PROMPTS[1]
    got = drop_one(lm, [prompt], new_tokens=5)
    cont = greedy_tokens(lm, prompt, RunSetting.full(), max_new_tokens=5, stop_at_eos=False)
    full = continuation_nll(lm, prompt, cont, RunSetting.full())
    for layer in (0, 2, 4):
        want = continuation_nll(lm, prompt, cont, RunSetting((layer,))) - full
        assert float(got["dropone.nll"][0, layer]) == pytest.approx(want, rel=1e-4, abs=1e-5), layer


def test_planted_identity_layers_score_zero_and_rank_least_important(result):
    s = result.series
    for key in ("bi.prefill", "bi.decode", "angular.last", "sublayer.attention", "sublayer.mlp",
                "sublayer.block", "magnitude.prefill", "magnitude.decode", "gate.prefill",
                "gate.decode", "taylor.prefill", "taylor.decode"):
        assert [s[key][i] for i in PLANTED] == [0.0, 0.0], key
    for key in ("dropone.nll", "dropone.kl"):  # the same result up to float rounding
        assert max(abs(s[key][i]) for i in PLANTED) < 1e-5, (key, [s[key][i] for i in PLANTED])
    assert all(row[0] == 0.0 for row in np.asarray(result.samples["angular.last"])[:, PLANTED])
    for m in MEASURED:  # the last layer (5) is free in POP's prefill: nothing reads its output
        for key in (f"{m}.{x}" for x in METHODS[m].series):
            others = [s[key][i] for i in range(5) if i not in PLANTED]
            assert max(s[key][i] for i in PLANTED) <= min(others), (key, s[key])


def test_agreement_of_a_method_with_itself_is_one_and_matches_scipy(result):
    a = result.agreement
    for i, name in enumerate(a["names"]):
        assert a["kendall"][i][i] == pytest.approx(1.0) and a["spearman"][i][i] == pytest.approx(1.0), name
        if name in result.samples:
            assert a["kendall_ci"][i][i] == pytest.approx([1.0, 1.0]), name
    x = np.array([[3, 1, 2, 2, 5, 0.5], [1, 1, 2, 3, 4, 4]], dtype=float)  # ties in both
    assert kendall_tau_b(x)[0, 1] == pytest.approx(kendalltau(x[0], x[1])[0])
    assert spearman_rho(x)[0, 1] == pytest.approx(spearmanr(x[0], x[1])[0])
    same = agreement({"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0]})
    assert same.kendall[0][1] == pytest.approx(1.0) and same.kendall_ci[0][1] is None  # no prompts


def test_the_result_is_a_checked_record(result, lm):
    payload = result.to_dict()
    check_result(payload, ImportanceResult, lm.adapter.n_layers)
    with pytest.raises(RecordError, match="the model has 7"):
        check_result(payload, ImportanceResult, 7)
    bad = {**payload, "series": {**payload["series"], "bi.prefill": [0.1] * 5}}
    with pytest.raises(RecordError, match="bi.prefill"):
        check_result(bad, ImportanceResult, 6)


def test_bad_method_names_and_zero_prompts_are_one_line(lm):
    assert parse_methods("all") == tuple(METHODS) and parse_methods("bi, gate") == ("gate", "bi")
    for text, match in (("gate,nope", "unknown method 'nope'"), (" , ", "no method named")):
        with pytest.raises(MethodError, match=match) as e:
            parse_methods(text)
        assert "\n" not in str(e.value)
    with pytest.raises(MethodError, match="at least one prompt"):
        ImportanceConfig(n_samples=0)
    with pytest.raises(MethodError, match="empty"):
        run_importance(lm, [], ImportanceConfig(methods=("bi",)))
