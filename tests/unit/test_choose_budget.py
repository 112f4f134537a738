"""The budgeted search and the per-budget comparison on tiny models with planted identity layers;
budgets and k out of range; a budget that no set meets."""
import pytest

from pop_analysis.experiments.choose import Budget, ChoiceResult, ChooseConfig, ChooseError, choose
from pop_analysis.experiments.methods_compare import (CompareConfig, CompareError,
    ComparisonResult, compare_methods)
from pop_analysis.experiments.methods_run import ImportanceConfig, run_importance
from pop_analysis.experiments.methods_store import check_choice, check_comparison
from pop_analysis.importance.picks import BudgetError, budget_k, check_k, pick, random_pick
from pop_analysis.progress import Cancelled
from pop_analysis.quality.items import EvalItem, EvalSet

from tiny import CancelWhen, planted_model, tiny_model, tiny_prompt

PLANTED = (1, 3)  # identity blocks of the 6-layer model
PROMPTS = [tiny_prompt(n, seed=n) for n in (5, 9, 3, 12, 7, 6)]
HELD_OUT = EvalSet("tiny held-out", "fp", tuple(EvalItem(tuple(tiny_prompt(n, seed=100 + n)))
                                                for n in (4, 8, 6, 10, 5, 7, 9, 3)))
FAST = dict(n_samples=8, answer_tokens=4, speed=False)


@pytest.fixture(scope="module")
def lm():
    return planted_model(PLANTED)


@pytest.fixture(scope="module")
def ranked(lm):
    return run_importance(lm, PROMPTS, ImportanceConfig(methods=("gate", "bi", "tail", "random"),
                                                       n_samples=6, new_tokens=4, resamples=0))


def test_the_search_finds_exactly_the_layers_that_change_nothing(lm, ranked):
    """The planted blocks, and the last block: in POP's prefill nothing reads its output (its K/V
    come from its input either way), so skipping it is exact too."""
    res = choose(lm, ranked.series["gate.prefill"], Budget(max_delta_nll=1e-3),
                 ChooseConfig(**FAST), evalset=HELD_OUT)
    assert res.met and res.chosen == sorted(PLANTED + (5,)), res.candidates
    assert {c["phase"] for c in res.candidates} == {"bisection", "refinement"}
    assert all(c["meets"] == (c["continuation_nll_delta_ci"][1] <= 1e-3) for c in res.candidates)
    assert not any(c["meets"] for c in res.candidates if len(c["skip_layers"]) > 3)
    assert res.n == 8 and "3 of 6 layers" in res.note and res.ideal_speedup > 1
    check_choice(res.to_dict(), ChoiceResult, 6)
    top1 = choose(lm, ranked.series["gate.prefill"], Budget(min_top1=0.999), ChooseConfig(**FAST),
                  evalset=HELD_OUT)
    assert top1.chosen == res.chosen


def test_a_budget_no_set_meets_says_so_and_shows_the_best_found():
    lm = tiny_model("llama", seed=5)
    res = choose(lm, [0.0, 1, 2, 3, 4, 5], Budget(max_delta_nll=1e-3),  # shallow layers first
                 ChooseConfig(**FAST, probes=1), evalset=HELD_OUT)
    assert not res.met and res.chosen == [] and res.best_found is not None
    assert res.note.startswith("no skip set meets ΔNLL upper bound <= 0.001") and "\n" not in res.note
    assert "the best found: layers 0" in res.note
    assert [c["k"] for c in res.candidates][-1] == 1, "bisection ends at one layer"


def test_the_search_is_bounded_and_cancellable(lm, ranked):
    res = choose(lm, ranked.series["bi.prefill"], Budget(max_delta_nll=1e-3),
                 ChooseConfig(**FAST, max_candidates=2), evalset=HELD_OUT)
    assert len(res.candidates) == 2

    with pytest.raises(Cancelled) as e:
        choose(lm, ranked.series["gate.prefill"], Budget(max_delta_nll=1e-3),
               ChooseConfig(**FAST), progress=CancelWhen(lambda update: True), evalset=HELD_OUT)
    assert e.value.partial is not None and e.value.partial.candidates == []


def test_bad_budgets_and_k_out_of_range_are_one_line():
    for make, match in ((lambda: Budget(), "give a budget"),
                        (lambda: Budget(max_delta_nll=-1), ">= 0"),
                        (lambda: Budget(min_top1=1.5), r"\(0, 1\]"),
                        (lambda: ChooseConfig(method="nope"), "unknown method"),
                        (lambda: CompareConfig(budgets=(1.2,)), r"in \(0, 1\)"),
                        (lambda: budget_k(6, 0.99), "out of range"),
                        (lambda: check_k(0, 6), "1..5"),
                        (lambda: pick([1.0, 2.0, 3.0], 3, "free"), "out of range"),
                        (lambda: pick([1.0, 2.0], 1, "ring"), "unknown skip-set shape")):
        with pytest.raises((ChooseError, BudgetError, CompareError), match=match) as e:
            make()
        assert "\n" not in str(e.value)
    assert budget_k(30, 1 / 3) == 10 and budget_k(6, 0.01) == 1
    assert random_pick(30, 5, "block", 7) == random_pick(30, 5, "block", 7)
    assert len(set(random_pick(30, 5, "free", 1))) == 5


def test_the_comparison_measures_every_methods_set_and_judges_against_the_tail(lm, ranked):
    res = compare_methods(lm, ranked, CompareConfig(budgets=(0.33,), random_seeds=2, **FAST),
                          evalset=HELD_OUT)
    check_comparison(res.to_dict(), ComparisonResult, 6)
    free = {r["method"]: r for r in res.rows if r["shape"] == "free" and r["method"] != "random"}
    assert free["gate"]["skip_layers"] == [3, 5] and free["tail"]["skip_layers"] == [4, 5]
    assert abs(free["gate"]["continuation_nll_delta"]) < 1e-5 < free["tail"]["continuation_nll_delta"]
    assert len([r for r in res.rows if r["method"] == "random"]) == 4  # 2 draws x 2 shapes
    v = next(v for v in res.verdicts if v["shape"] == "free")
    assert v["best"] in ("gate", "bi") and v["best_delta"] < 1e-5 and "tail" in v["line"]
    assert res.n == 8 and set(res.item_nll) >= {"full", "3, 5", "4-5"}
