"""The certified choice's statistics: exact binomial bounds against textbook values, the
Hoeffding-Bentkus bound for non-binary losses, fixed-sequence testing on synthetic losses with
known rates, and a small simulation: the certified procedure's violation rate stays under δ plus
its Monte-Carlo error, and choosing and reporting on the same items violates more often."""
import math

import numpy as np
import pytest
from scipy import stats as st

from pop_analysis.quality.guarantee import (GuaranteeError, bad_items, binomial_p,
    clopper_pearson_upper, fixed_sequence, hoeffding_bentkus_p, hoeffding_bentkus_upper,
    risk_bound)
from pop_analysis.quality.guarantee_sim import simulate


def test_the_exact_bound_and_its_p_value_agree():
    b = risk_bound([1] * 3 + [0] * 97, alpha=0.1, delta=0.05)
    assert (b.n, b.bad, b.rate, b.method) == (100, 3, 0.03, "clopper-pearson")
    two_sided_90 = st.binomtest(3, 100).proportion_ci(0.90, method="exact").high
    assert b.upper == pytest.approx(two_sided_90) == pytest.approx(0.0757, abs=1e-4)
    assert b.p_value == pytest.approx(st.binom.cdf(3, 100, 0.1)) and b.passes(0.05)
    for k in range(0, 30):  # upper <= alpha exactly when p <= delta
        assert (clopper_pearson_upper(k, 200, 0.05) <= 0.1) == (binomial_p(k, 200, 0.1) <= 0.05)
    assert clopper_pearson_upper(5, 5, 0.05) == 1.0


def test_bentkus_serves_non_binary_losses_and_is_looser_on_binary_ones():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 0.2, 400)
    b = risk_bound(x, alpha=0.2, delta=0.05)
    assert b.method == "hoeffding-bentkus" and x.mean() < b.upper < 0.2
    assert hoeffding_bentkus_p(b.rate, 400, b.upper) == pytest.approx(0.05, abs=1e-6)
    # a valid bound: the true mean 0.1 is covered far more often than 95% of the time
    covered = np.mean([hoeffding_bentkus_upper(rng.uniform(0, 0.2, 200).mean(), 200, 0.05) >= 0.1
                       for _ in range(200)])
    assert covered >= 0.95
    for k in (0, 5, 20):  # e times a binomial tail: never tighter than the exact bound
        assert hoeffding_bentkus_p(k / 100, 100, 0.1) >= binomial_p(k, 100, 0.1) * (1 - 1e-9)


@pytest.mark.parametrize("call, match", [
    (lambda: risk_bound([], 0.1, 0.05), "at least one item"),
    (lambda: risk_bound([0.5, 2.0], 0.1, 0.05), r"\[0, 1\]"),
    (lambda: risk_bound([0, 1], 1.5, 0.05), "alpha must lie"),
    (lambda: risk_bound([0, 1], 0.1, 0.0), "delta must lie"),
    (lambda: bad_items([0.1, float("nan")], 0.1), "not finite")])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(GuaranteeError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def _sets(rates, n, seed):
    """Per-item bad indicators (n, m) with exactly round(rate * n) bad items per set."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, len(rates)))
    for j, r in enumerate(rates):
        out[rng.permutation(n)[:round(r * n)], j] = 1
    return out


def test_fixed_sequence_certifies_the_expected_set_and_stops_at_the_first_failure():
    rates = [0.0, 0.02, 0.04, 0.30, 0.02]  # the fifth would pass, but the fourth fails first
    bad = _sets(rates, 300, seed=1)
    called = []

    def test(j):
        def run():
            called.append(j)
            return risk_bound(bad[:, j], 0.1, 0.05)
        return run

    last, bounds = fixed_sequence([test(j) for j in range(5)], 0.05)
    assert last == 2 and called == [0, 1, 2, 3], "lazy: nothing after the first failure"
    assert [b.passes(0.05) for b in bounds] == [True, True, True, False]
    first_fails = _sets([0.3, 0.0, 0.0], 300, seed=2)
    last, bounds = fixed_sequence([lambda j=j: risk_bound(first_fails[:, j], 0.1, 0.05)
                                   for j in range(3)], 0.05)
    assert last == -1 and len(bounds) == 1, "a sequence whose first set fails certifies nothing"


def test_the_guarantee_holds_in_simulation_and_the_same_items_procedure_breaks_it():
    """Nested candidates whose rates climb to just above α and stay there: the certified set's
    rate exceeds α in at most δ (plus Monte-Carlo error) of the splits; taking the largest set
    that meets the bound on the items that chose it does so far more often."""
    alpha, delta = 0.1, 0.1
    rates = [0.02, 0.04, 0.06, 0.08] + [0.115] * 12
    bad = _sets(rates, 4000, seed=3)
    sim = simulate(bad, alpha, delta, n_sel=100, n_cert=300, n_splits=500, seed=4)
    cert, same = sim.violations["certified"], sim.violations["same_items"]
    assert cert["rate"] <= delta + sim.mc_margin(), sim.violations
    assert same["rate"] > cert["rate"] + 3 * math.hypot(cert["mc_se"], same["mc_se"]), sim.violations
    assert sim.chosen_share["certified"] > 0.5, "the procedure certifies something most of the time"
    assert sim.pool_rates == pytest.approx(rates, abs=1e-9)
