"""Batched evaluation on tiny random models: the batch budget, batched scores equal item-by-item ones, the trunk shared from the first skipped layer."""
import math

import pytest
import torch

from pop_analysis.engine.pop import run_prompt, teacher_force
from pop_analysis.quality.evaluate import (
    LOGIT_BUDGET,
    PER_ITEM,
    TOKEN_BUDGET,
    Arm,
    batches,
    evaluate_variants,
    token_budget_for,
)
from pop_analysis.quality.items import EvalDataError, EvalItem
from pop_analysis.quality.metrics import agreement, greedy_tokens, score_continuations
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

VARIANTS = [Arm("pop", RunSetting((3, 4, 5))), Arm("static", RunSetting((4, 5), "static")),
            Arm("no_boundary", RunSetting((2, 3), "pop_no_boundary")),
            Arm("shallow", RunSetting((0, 1)))]


ITEMS = [EvalItem(tuple(tiny_prompt(n, seed=n)), tuple(tiny_prompt(m, seed=50 + n)) if m else ())
         for n, m in ((12, 5), (5, 0), (17, 9), (1, 3), (9, 0), (8, 1))]


def close(a, b, tol=1e-4) -> bool:
    if a is None or b is None or isinstance(a, str):
        return a == b
    return math.isclose(a, b, abs_tol=tol)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def lm(request):
    return tiny_model(request.param)


def test_batches_respect_the_budget():
    groups = batches(ITEMS, 4, token_budget=40)
    assert sorted(i for g in groups for i in g) == list(range(len(ITEMS)))
    for g in groups:
        longest = max(len(ITEMS[i].prompt_ids) for i in g) + max(
            len(ITEMS[i].reference_ids) or 4 for i in g)
        assert len(g) == 1 or len(g) * longest <= 40
    assert [len(g) for g in batches(ITEMS, 4, token_budget=1)] == [1] * len(ITEMS)


def test_a_large_vocabulary_gets_fewer_tokens_per_batch():
    # the log-probabilities of a batch, (B, M, V) floats, stay within LOGIT_BUDGET
    assert token_budget_for(49152) == TOKEN_BUDGET  # SmolLM2: unchanged
    gemma = token_budget_for(262144)
    assert gemma * 262144 <= LOGIT_BUDGET < (gemma + 1) * 262144 and gemma < TOKEN_BUDGET / 4
    assert token_budget_for(10 ** 12) == 1 and token_budget_for(262144, 100) == 100


def test_batched_equals_one_item_at_a_time(lm):
    together = evaluate_variants(lm, ITEMS, VARIANTS, 6, token_budget=4096)
    alone = evaluate_variants(lm, ITEMS, VARIANTS, 6, token_budget=1)
    assert max(len(g) for g in batches(ITEMS, 6, 4096)) > 3  # really batched
    for name in ["full"] + [v.name for v in VARIANTS]:
        for metric in PER_ITEM:
            a, b = getattr(together[name], metric), getattr(alone[name], metric)
            bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if not close(x, y)]
            assert not bad, f"{lm.name} {name} {metric}: {bad}"


def test_engine_equals_the_one_prompt_primitives(lm):
    out = evaluate_variants(lm, ITEMS, VARIANTS, 6)
    for i, it in enumerate(ITEMS):
        ref = greedy_tokens(lm, it.prompt_ids, RunSetting.full(), 6)
        cont = list(it.reference_ids) or ref
        full = score_continuations(lm, it.prompt_ids, [cont], RunSetting.full())[0]
        for v in VARIANTS:
            s = score_continuations(lm, it.prompt_ids, [cont], v.setting)[0]
            got = out[v.name]
            assert close(got.continuation_nll[i], s.nll), (v.name, i)
            top1 = sum(a == b for a, b in zip(s.argmax, cont)) / len(cont)
            assert close(got.teacher_forced_top1[i], top1), (v.name, i)
            agree = sum(a == b for a, b in zip(s.argmax, full.argmax)) / len(cont)
            assert close(got.next_token_top1[i], agree), (v.name, i)
            ag = agreement(ref, greedy_tokens(lm, it.prompt_ids, v.setting, 6))
            assert (got.greedy_agreement[i], got.first_divergence[i]) == (ag.match_rate,
                                                                           ag.first_divergence)


def test_kl_is_the_full_models_divergence_on_every_token(lm):
    it, v = ITEMS[2], VARIANTS[0]
    got = evaluate_variants(lm, [it], [v], 4).get("pop").next_token_kl[0]
    a, ids = lm.adapter, torch.tensor([list(it.prompt_ids)])
    fed = torch.tensor([list(it.reference_ids[:-1])])  # (1, M-1)

    def logprobs(setting):
        first = run_prompt(a, ids, setting)
        logits = teacher_force(a, fed, first.cache, first.position, setting.decode_drop)
        return torch.log_softmax(torch.cat([first.logits[:, None], logits], 1)[0], -1)  # (M, V)

    p, q = logprobs(RunSetting.full()), logprobs(v.setting)
    ref = torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1).mean()
    assert got > 0 and close(got, ref.item(), 1e-5), (got, ref.item())


def test_bad_requests(lm):
    with pytest.raises(EvalDataError, match="empty"):
        evaluate_variants(lm, [], VARIANTS, 4)
    with pytest.raises(EvalDataError, match="twice"):
        evaluate_variants(lm, ITEMS[:1], [VARIANTS[0], VARIANTS[0]], 4)
    with pytest.raises(ValueError, match="unknown variant"):
        evaluate_variants(lm, ITEMS[:1], [Arm("x", RunSetting((1,), "half"))], 4)


@pytest.mark.parametrize("family", ["mistral_sliding", "gemma2"])
def test_sliding_window_models_run_every_layer_and_agree(family):
    from test_families import build

    from pop_analysis.engine.trunk import start_layer

    lm = build(family)
    assert start_layer(lm.adapter, RunSetting((3, 4, 5))) == 0  # no trunk shared across a window
    out = evaluate_variants(lm, ITEMS[:3], VARIANTS[:2], 4)
    for i, it in enumerate(ITEMS[:3]):
        cont = list(it.reference_ids) or greedy_tokens(lm, it.prompt_ids, RunSetting.full(), 4)
        s = score_continuations(lm, it.prompt_ids, [cont], RunSetting((3, 4, 5)))[0]
        assert close(out["pop"].continuation_nll[i], s.nll), (family, i)


def test_trunk_is_shared_from_the_first_skipped_layer(lm):
    from pop_analysis.engine.trunk import start_layer

    assert start_layer(lm.adapter, RunSetting((3, 4, 5))) == 3
    assert start_layer(lm.adapter, RunSetting((5, 2), "static")) == 2
    assert start_layer(lm.adapter, RunSetting.full()) == 0
    assert start_layer(lm.adapter, RunSetting((0, 1))) == 0
