"""The Methods page's figure builders (pure plotly) on hand-made results."""
import math

from dashboard.charts import methods as charts

ROWS = [dict(method=m, shape="free", k=k, budget=k / 6, set=s, skip_layers=[], seed=0,
             continuation_nll_delta=d, continuation_nll_delta_ci=[d - 0.1, d + 0.1])
        for m, k, s, d in (("tail", 1, "5", 0.2), ("tail", 2, "4-5", 0.5), ("gate", 1, "3", 0.1),
                           ("gate", 2, "3, 5", 0.3), ("random", 1, "0", 1.0), ("random", 1, "2", 2.0))]


def test_curves_are_normalised_and_keep_the_raw_values_for_hover():
    assert charts.normalised([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert charts.normalised([7.0, 7.0]) == [0.0, 0.0], "a constant series has no ranking"
    fig = charts.curves_chart({"bi.prefill": [1.0, 3.0], "tail.depth": [1.0, 0.5]},
                              {"bi.prefill": "BI"}, ["bi.prefill", "tail.depth"], skip=(1,))
    assert [t.name for t in fig.data] == ["BI", "tail.depth"]
    assert list(fig.data[0].y) == [0.0, 1.0] and list(fig.data[0].customdata) == [1.0, 3.0]
    assert fig.data[1].line.color == charts.TAIL


def test_heatmaps_show_agreement_and_the_triangle():
    agree = {"names": ["a", "b"], "n": 4, "kendall": [[1.0, 0.2], [0.2, 1.0]],
             "kendall_ci": [[[1.0, 1.0], None], [None, [1.0, 1.0]]]}
    fig = charts.agreement_heatmap(agree)
    assert fig.data[0].zmin == -1 and "n = 4" in fig.layout.title.text
    tri = charts.triangle_heatmap([[0.1, 0.3], [0.2]])
    z = tri.data[0].z
    assert z[0][1] == 0.3 and math.isnan(z[1][1]), "cells beyond the last block are empty"


def test_frontiers_draw_the_tail_in_black_with_intervals_and_random_as_a_range():
    fig = charts.frontier_chart(ROWS, "free", {"tail": "Tail", "gate": "Gate"})
    names = [t.name for t in fig.data]
    assert names == ["random (range of draws)", "Tail", "Gate"]
    tail = fig.data[1]
    assert tail.line.color == charts.TAIL and [round(x, 9) for x in tail.error_y.array] == [0.1, 0.1]
    assert list(fig.data[0].y) == [2.0, 1.0], "the draws' range at k = 1"
    assert [c[1] for c in fig.data[2].customdata] == ["3", "3, 5"], "points know their set"


def test_candidates_ring_the_chosen_set_and_draw_the_budget():
    cands = [dict(k=1, set="5", skip_layers=[5], phase="bisection", meets=True,
                  continuation_nll_delta=0.0, continuation_nll_delta_ci=[-0.01, 0.01]),
             dict(k=2, set="4-5", skip_layers=[4, 5], phase="bisection", meets=False,
                  continuation_nll_delta=0.3, continuation_nll_delta_ci=[0.2, 0.4])]
    fig = charts.candidates_chart(cands, 0.1, [5])
    assert [t.name for t in fig.data] == ["meets the budget", "misses it", "chosen"]
    assert fig.layout.shapes[0].y0 == 0.1
