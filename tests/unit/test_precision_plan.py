"""The precision planner, the frontier, the batched evaluation and cache drift with int8 layers."""
import itertools

import pytest
import torch

from pop_analysis.engine.pop import run_prompt, teacher_force
from pop_analysis.engine.precision import Configuration, Precision, from_plan, PrecisionError
from pop_analysis.experiments.precision_frontier import (Point, best_at, check_pick, frontier,
                                                         grid, standard)
from pop_analysis.importance.precision_plan import (PlanError, int8_errors, layer_losses, plan,
                                                    predicted_loss, predicted_ms)
from pop_analysis.inspection.cache_drift import cache_cosine
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.items import EvalItem
from pop_analysis.speed.precision_speed import FULL, ideal

from tiny import tiny_model, tiny_prompt
from pop_vllm.run_setting import RunSetting


def brute_force(costs, losses, budget):
    """Every plan of every layer: the fastest within budget."""
    best = None
    for p in itertools.product(("full", "int8", "skip"), repeat=len(costs)):
        if predicted_loss(p, losses) <= budget + 1e-12:
            ms = predicted_ms(p, costs)
            best = ms if best is None or ms < best else best
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_planner_finds_the_fastest_plan_within_budget(seed):
    g = torch.Generator().manual_seed(seed)
    n = 6
    full = torch.rand(n, generator=g) + 1.0
    costs = [{"full": float(f), "int8": float(f) * 0.4, "skip": 0.05} for f in full]
    imp = (torch.rand(n, generator=g) * 2).tolist()
    err = (torch.rand(n, generator=g) * 0.5).tolist()
    losses = layer_losses(imp, err)
    budget = float(torch.rand(1, generator=g)) * sum(imp) / 4
    pick = plan(costs, losses, budget)
    assert pick.loss <= budget + 1e-9
    assert pick.ms == pytest.approx(brute_force(costs, losses, budget), rel=0.02)


def test_a_zero_budget_keeps_every_lossy_layer_in_full_and_bad_budgets_are_refused():
    costs = [{"full": 1.0, "int8": 0.5, "skip": 0.1}] * 3
    losses = layer_losses([1.0, 0.0, 2.0], [0.1, 0.1, 0.1])
    assert plan(costs, losses, 0.0).layers == ("full", "skip", "full")
    with pytest.raises(PlanError, match="budget must be a loss >= 0"):
        plan(costs, losses, -1.0)


def test_grid_standard_and_from_plan():
    g = grid(30)
    assert len(g) >= 16 and len({c.name for c in g}) == len(g)
    names = [c.name for c in standard(30)]
    assert names == ["pop", "int8 prefill", "uniform int8", "pop + int8 prefill"]
    c = from_plan("x", ["int8", "full", "skip"])
    assert (c.variant, c.skip, c.precision.int8) == ("pop", (2,), (0,))
    with pytest.raises(PrecisionError, match="unknown layer precision"):
        from_plan("x", ["half"])


def test_frontier_and_the_check_at_equal_quality():
    pts = [Point("a", 1.5, 0.10), Point("b", 2.0, 0.30), Point("c", 1.2, 0.20), Point("d", 1.0, 0.0)]
    assert [p.name for p in frontier(pts)] == ["d", "a", "b"]
    assert best_at(pts, 0.2).name == "a" and best_at(pts, -1) is None
    out = check_pick(Point("pick", 1.8, 0.15), pts)
    assert out["best"] == "a" and out["share_of_best"] == pytest.approx(1.2)


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama")


def test_batched_evaluation_with_int8_layers_equals_a_direct_computation(lm):
    a = lm.adapter
    items = [EvalItem(tuple(tiny_prompt(n, seed=n)), tuple(tiny_prompt(5, seed=50 + n)), None,
                      str(n)) for n in (7, 9, 12)]
    prec = Precision((2, 3))
    uniform = Precision((0, 1, 2, 3, 4, 5), decode_int8=True)
    out = evaluate_variants(lm, items, [Arm("p8", RunSetting((5,), precision=prec)),
                                        Arm("u8", RunSetting.full().replace(precision=uniform))],
                            max_new_tokens=4, generate=True)
    for k, it in enumerate(items):
        ids = torch.tensor([list(it.prompt_ids)])
        first = run_prompt(a, ids, RunSetting((5,), precision=prec))
        cont = torch.tensor([list(it.reference_ids)])
        lp = torch.cat([torch.log_softmax(first.logits, -1)[:, None],
                        torch.log_softmax(teacher_force(a, cont[:, :-1], first.cache,
                                                        first.position), -1)], 1)  # (1, M, V)
        nll = float(-lp.gather(-1, cont[..., None]).mean())
        assert out["p8"].continuation_nll[k] == pytest.approx(nll, abs=1e-4)
    assert all(kl > 0 for kl in out["u8"].next_token_kl)
    assert all(kl == 0 for kl in out["full"].next_token_kl)


def test_cache_cosine_is_one_against_itself_and_below_one_for_int8(lm):
    a, ids = lm.adapter, torch.tensor([tiny_prompt(12)])
    full = run_prompt(a, ids, RunSetting.full()).cache
    same = cache_cosine(a, run_prompt(a, ids, RunSetting.full()).cache, full)
    assert all(abs(x - 1) < 1e-9 for x in same["k"] + same["v"])
    low = cache_cosine(a, run_prompt(a, ids, RunSetting.full().replace(precision=Precision((0,)))).cache, full)
    assert low["v"][0] < 1 - 1e-6 and min(low["k"]) < 1


def test_int8_errors_are_small_and_positive_and_the_ideal_counts_int8(lm):
    err = int8_errors(lm, [tiny_prompt(10)])
    assert len(err) == lm.adapter.n_layers and all(0 < e < 0.2 for e in err), err
    every = Configuration("i", RunSetting.full().replace(
        precision=Precision(tuple(range(lm.adapter.n_layers)))))
    assert 1 < ideal(lm, 64, every) <= 4.0 + 1e-9
    assert ideal(lm, 64, FULL) == pytest.approx(1.0)
