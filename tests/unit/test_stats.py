"""Statistics against known values and scipy, refusals, and paired intervals on constructed data."""
import math

import numpy as np
import pytest
from scipy import stats as st

from pop_analysis.quality.stats import (
    NO_CHANGE,
    StatsError,
    mean_ci,
    paired_accuracy_delta,
    paired_delta,
    proportion_ci,
    required_n,
    verdict,
)


def test_mean_ci_is_the_t_interval():
    e = mean_ci([1, 2, 3, 4, 5])
    half = st.t.ppf(0.975, 4) * math.sqrt(2.5 / 5)  # t(0.975, 4) * s / sqrt(n)
    assert (e.n, e.value, e.method) == (5, 3.0, "t")
    assert e.ci == pytest.approx((3 - half, 3 + half)) and e.ci == pytest.approx((1.0367, 4.9633), abs=1e-4)
    assert mean_ci([2.0, 2.0, 2.0]).ci == (2.0, 2.0)  # no spread, no width
    assert mean_ci([1.0, None, float("nan"), 3.0]).n == 2  # missing values are not items


def test_proportion_ci_is_clopper_pearson():
    e = proportion_ci([1, 1, 1] + [0] * 7)
    assert (e.n, e.value) == (10, 0.3)
    assert e.ci == pytest.approx((0.06674, 0.65245), abs=1e-5)  # the textbook exact interval
    assert proportion_ci([0] * 20).ci[0] == 0.0 and proportion_ci([1] * 20).ci[1] == 1.0


@pytest.mark.parametrize("call", [lambda: mean_ci([1.0]), lambda: proportion_ci([]),
                                  lambda: paired_delta([1.0], [2.0]),
                                  lambda: paired_accuracy_delta([1], [0]),
                                  lambda: paired_delta([1.0, None], [2.0, 3.0])])
def test_fewer_than_two_items_refuse_an_interval(call):
    with pytest.raises(StatsError, match="at least 2 items, got n = 1|got n = 0"):
        call()


def test_paired_delta_uses_the_pairing():
    rng = np.random.default_rng(0)
    full = rng.normal(3.0, 1.0, 200)  # items differ a lot from each other ...
    variant = full + 0.05 + rng.normal(0, 0.02, 200)  # ... but the variant moves each a little
    e = paired_delta(variant, full)
    assert e.n == 200 and e.method == "bootstrap-bca"
    assert e.ci[0] > 0 and e.includes(0.05) and e.width < 0.01
    unpaired = st.ttest_ind(variant, full).confidence_interval()
    assert unpaired.low < 0 < unpaired.high  # unpaired, the same shift is lost in the spread
    assert paired_delta(full + 0.5, full).ci == pytest.approx((0.5, 0.5))
    assert paired_delta(variant, full) == e  # seeded: the same data give the same interval
    with pytest.raises(StatsError, match="equal lengths"):
        paired_delta([1, 2, 3], [1, 2])


def test_paired_delta_interval_covers_zero_without_an_effect():
    rng = np.random.default_rng(1)
    full = rng.normal(size=100)
    e = paired_delta(full + rng.normal(0, 0.1, 100), full)
    assert e.includes(0.0) and verdict(e, higher_is_better=False) == NO_CHANGE


def test_mcnemar_on_discordant_pairs():
    full = [1] * 50 + [0] * 150
    variant = [1] * 40 + [0] * 160  # 10 items only the full model gets right, none the other way
    e = paired_accuracy_delta(variant, full)
    assert (e.n, e.value, e.method) == (200, -0.05, "mcnemar-exact")
    assert e.p_value == pytest.approx(st.binomtest(0, 10, 0.5).pvalue) == pytest.approx(2 / 2 ** 10)
    assert e.ci[1] < 0 < -e.ci[0] and e.includes(-0.05) and verdict(e) == "worse"
    same = paired_accuracy_delta(full, full)
    assert same.value == 0 and same.p_value == 1.0 and same.includes(0) and verdict(same) == NO_CHANGE
    # a balanced swap of 10 items each way: no measurable change either
    swap = paired_accuracy_delta([0] * 10 + [1] * 40 + [1] * 10 + [0] * 140, full)
    assert swap.value == 0 and swap.p_value == 1.0 and swap.includes(0)


def test_mcnemar_interval_is_conservative():
    """Interval excluding 0 implies McNemar's p < 0.05 (never a difference the test rejects)."""
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(10, 120))
        full = rng.random(n) < 0.5
        variant = np.where(rng.random(n) < 0.2, rng.random(n) < 0.5, full)
        e = paired_accuracy_delta(variant, full)
        assert e.ci[0] <= e.value <= e.ci[1]
        if not e.includes(0):
            assert e.p_value < 0.05, (n, e)


def test_required_n_matches_the_t_interval():
    n = required_n(0.2, 0.05)
    width = lambda k: 2 * st.t.ppf(0.975, k - 1) * 0.2 / math.sqrt(k)  # noqa: E731
    assert width(n) < 0.05 <= width(n - 1)
    assert required_n(0.0, 0.05) == 2


def test_delta_text_never_reads_an_overlap_as_a_win():
    from pop_analysis.quality.summary import comparison_rows, delta_text

    worse = {"variant": "pop", "n": 64, "continuation_nll_delta": 0.15,
             "continuation_nll_delta_ci": [0.13, 0.17]}
    same = {"variant": "pop", "n": 64, "retrieval_acc_delta": 0.02,
            "retrieval_acc_delta_ci": [-0.03, 0.07]}
    assert delta_text(worse, "continuation_nll") == "+0.150 [+0.130, +0.170] worse"
    assert delta_text(same, "retrieval_acc").endswith(NO_CHANGE)
    assert delta_text({"retrieval_acc_delta": 0.5, "retrieval_acc_delta_ci": None},
                      "retrieval_acc") == "+0.500 (no interval: fewer than 2 items)"
    assert delta_text({"variant": "full"}, "continuation_nll") is None
    lost = {"n": 200, "retrieval_acc_delta": -0.1, "retrieval_acc_delta_ci": [-0.15, -0.05],
            "retrieval_acc_delta_p": 0.0012}
    assert delta_text(lost, "retrieval_acc", pct=True) == "-10.0 [-15.0, -5.0] worse, p = 0.0012"
    mc = {"n": 200, "acc_delta": 0.01, "acc_delta_ci": [-0.02, 0.04]}  # a metric of lm-eval's
    assert delta_text(mc, "acc", pct=True) == f"+1.0 [-2.0, +4.0] {NO_CHANGE}"
    mc_lost = {"n": 200, "acc_delta": -0.045, "acc_delta_ci": [-0.102, -0.002], "acc_delta_p": 0.012}
    assert delta_text(mc_lost, "acc", pct=True) == "-4.5 [-10.2, -0.2] worse, p = 0.012"
    table = comparison_rows([{"variant": "full", "n": 64}, {**worse, **same}])
    assert [r["row"] for r in table] == ["full", "pop"]
    assert table[0]["continuation_nll"] == "—" and table[1]["retrieval_acc"].endswith(NO_CHANGE)


def test_mean_halfwidths_are_students_t_intervals_of_the_mean():
    from scipy import stats as sst

    from pop_analysis.quality.stats import mean_halfwidths

    x = [1.0, 2.0, 4.0, 7.0]
    s_n = float(np.std(x))  # divided by n, as a calibration stores it
    want = sst.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=sst.sem(x))
    (half,) = mean_halfwidths([s_n], len(x))
    assert half == pytest.approx((want[1] - want[0]) / 2)
    assert mean_halfwidths([1.0], 1) is None
