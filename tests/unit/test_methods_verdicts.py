"""Honest counting in the methods comparison and its report: methods that pick the identical set
are named together and no count credits one of them alone; budgets that give the same k are one
cell, named with both budgets, in the verdicts, the counts and the ΔNLL table's columns."""
from pop_analysis.experiments import methods_verdicts as mv
from pop_analysis.experiments.report_methods import quality_table, tail_lines


def _row(method, budget, k, layers, delta, shape="free"):
    return {"method": method, "budget": budget, "shape": shape, "k": k, "set": layers,
            "continuation_nll_delta": delta, "continuation_nll_delta_ci": [delta - .01, delta + .01]}


ROWS = [  # 20% and 25% of 18 layers are both k = 4; at k = 6 the gate's set is the tail's
    *[_row(m, b, 4, s, d) for b in (0.2, 0.25) for m, s, d in
      (("gate", "13-15, 17", -0.012), ("taylor", "13-15, 17", -0.012), ("tail", "14-17", 0.032),
       ("bi", "8-11", 0.301))],
    *[_row(m, 0.33, 6, s, d) for m, s, d in
      (("gate", "12-17", 0.112), ("tail", "12-17", 0.112), ("bi", "8-13", 0.329))],
    *[{**_row("random", b, k, None, d), "seed": i} for b, k in ((0.2, 4), (0.25, 4), (0.33, 6))
      for i, d in enumerate((0.3, 0.5, 0.9))]]
PAIRED = {("13-15, 17", "14-17"): (-0.044, (-0.055, -0.032)), ("14-17", "8-11"): (-0.27, (-.3, -.2)),
          ("12-17", "8-13"): (-0.2, (-0.25, -0.15))}


def paired(a, b):
    if (a, b) in PAIRED:
        return PAIRED[(a, b)]
    if (b, a) in PAIRED:
        v, (lo, hi) = PAIRED[(b, a)]
        return -v, (-hi, -lo)
    return None


def test_ties_are_named_and_budgets_of_one_k_merged():
    vs = mv.verdicts(ROWS, paired)
    assert [(v["budgets"], v["k"]) for v in vs] == [([0.2, 0.25], 4), ([0.33], 6)]
    k4, k6 = vs
    assert k4["best_methods"] == ["gate", "taylor"] and k4["separated"] and k4["vs_tail"] == -0.044
    assert k4["line"].startswith("20% and 25% (4 layers, free): best Gate Fisher and Gate Taylor, "
                                 "which pick the same set (layers 13-15, 17")
    assert k6["best_methods"] == ["gate", "tail"] and "vs_tail" not in k6
    assert "the tail's set is among them: a tie, not a win" in k6["line"]
    assert k4["tail_beats"] == ["bi"] and k6["tail_beats"] == ["bi"]
    assert k4["random"] == [0.3, 0.5, 0.9]


def test_counts_credit_no_one_alone_and_the_report_says_so():
    vs = mv.verdicts(ROWS, paired)
    c = mv.counts(vs)
    assert (c["cells"], c["tail_alone"], c["tail_tied"], c["other"]) == \
        (2, [], ["33% free"], ["20% and 25% free"])
    assert c["tail_beats"] == {"bi": 2}, "a merged cell counts once"
    lines = tail_lines(vs)
    assert lines[0] == ("Of 2 distinct budget and shape cells, the tail's set is the best alone in "
                        "0; it is best together with other methods that pick the identical set in 1 "
                        "(33% free); another method's set is best in 1 (20% and 25% free).")
    assert lines[1] == "Budgets that give the same k are one cell: 20% and 25% are both 4 layers."
    assert "20% and 25% free (Gate Fisher and Gate Taylor, -0.044 [-0.055, -0.032])" in lines[2]
    table = quality_table({"rows": ROWS}, "free")
    assert table[0] == "| method | 20% and 25% (4 layers) | 33% (6 layers) |"
    assert table[2].startswith("| Gate Fisher | -0.012 [-0.022, -0.002] · 13-15, 17 |")
