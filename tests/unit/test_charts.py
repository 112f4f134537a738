"""Pure figure builders and the generation comparison helpers (no streamlit, no model)."""
import math

import pytest

from dashboard.charts import calibrate as calibrate_charts
from dashboard.charts.calibrate import ImportanceView as View
from dashboard.charts import drift as drift_charts
from dashboard.charts import layers as layer_charts
from dashboard.charts import stepthrough as step_charts
from dashboard.charts import style
from dashboard.charts import sweeps as sweep_charts
from dashboard.panels.generate_text import repeats
from pop_analysis.experiments.paper import PAPER_DRIFT


def test_runs_groups_contiguous_layers():
    assert style.runs([9, 3, 4, 5]) == [(3, 5), (9, 9)]
    assert style.runs([]) == []


def test_step_grid_draws_the_recorded_cells_and_the_cache_so_far():
    n = 4
    earlier = {"attention": [[0, 1, 2]] * 2 + [[0, 1, 2], []], "kv": [[], [], [], [0, 1]]}
    step = {"attention": [[], [], [2], [2]], "kv": [[]] * 4}
    labels = step_charts.position_labels(["a", "b", "c"], [])
    assert labels == ["x1 a", "x2 b", "x_N c"]
    fig = step_charts.step_grid(step, [earlier], n, labels, "boundary")
    ran, cache = list(map(list, fig.data[0].z)), list(map(list, fig.data[1].z))
    assert ran[3] == [step_charts.IDLE, step_charts.IDLE, step_charts.RAN]
    assert cache[3] == [step_charts.OLD_KV, step_charts.OLD_KV, step_charts.NEW_FULL]
    assert cache[0] == [step_charts.OLD_FULL] * 3

def test_layer_strip_crosses_skipped_layers_and_colours_by_log_importance():
    imp = [1.0, 0.1, 0.0, 10.0]
    fig = layer_charts.layer_strip(4, (2,), imp)
    bar = fig.data[0]
    assert list(bar.marker.symbol) == ["square", "square", "square-x", "square"]
    colours = list(bar.marker.color)
    assert colours[0] == 0.0 and math.isclose(colours[1], -1.0)
    assert math.isclose(colours[2], math.log10(10.0 * 1e-6)), "a zero is clamped six decades down"


def test_importance_chart_has_bands_and_log_axis():
    fig = calibrate_charts.importance_chart([1, 2, 3], [3, 2, 1], [0.1] * 3, [0.2] * 3,
                                            View(log=True, bands=True, skip=(2,)))
    names = [t.name for t in fig.data]
    assert names == ["prefill 95% interval", "prefill importance", "decode 95% interval",
                     "decode importance"]
    assert fig.layout.yaxis.type == "log"
    assert len(fig.layout.shapes) == 1, "one shaded run for the skipped layer"
    linear = calibrate_charts.importance_chart([1, 2], [2, 1], view=View(log=False, bands=False))
    assert linear.layout.yaxis.type == "linear" and len(linear.data) == 2


def test_call_counts_heatmap_rows_follow_stages():
    counts = {"decode": {"attention": [2, 2]}, "prefill": {"attention": [1, 0], "k_proj": [1, 1]},
              "boundary": {"attention": [1, 1]}}
    fig = layer_charts.call_counts_heatmap(counts, "t")
    assert list(fig.data[0].y) == ["prefill · attention", "prefill · k_proj", "boundary · attention",
                                   "decode · attention"]


def test_drift_panels_restrict_to_the_skipped_block_and_draw_the_papers_values():
    d = {f"{q}_cos": [1.0, 0.9, 0.8, 0.7] for q in ("hidden", "k", "v", "attn_out")}
    fig = drift_charts.drift_panels(d, (2, 3), only_skipped=True, reference=PAPER_DRIFT)
    assert all(list(t.x) == [2, 3] for t in fig.data)
    assert len(fig.data) == 4, "one line per panel (no minima in this record)"
    lines = sorted(round(s.y0, 2) for s in fig.layout.shapes)
    assert lines == [0.46, 0.71, 0.96], "the paper's hidden, V and attention-output values"
    rows = [{"length": 16, "hidden": 0.9, "k": 0.8, "v": 0.7, "attn_out": 0.99, "kl": 0.1}]
    assert list(drift_charts.drift_length_chart(rows).data[0].y) == [0.9]


def test_a_loop_is_named_and_ordinary_text_is_not():
    assert repeats([5, 9, 9, 9, 9, 2]) and repeats([1, 7, 8, 7, 8, 7, 8])
    assert not repeats([1, 2, 3, 1, 2, 4, 1, 2, 5]) and not repeats([4, 4, 4])


SPEED_ROWS = [  # two timed lengths (one flagged), as a length sweep stores them
    {"length": 128, "variant": "pop", "skip_ratio": 0.33, "prefill_speedup": 1.3,
     "speedup_range": [1.25, 1.35], "timing_rounds": 5, "timing_trustworthy": True,
     "timing_note": None, "ideal_speedup": 1.45, "roofline_speedup": 1.35},
    {"length": 32, "variant": "pop", "skip_ratio": 0.33, "prefill_speedup": 8.08,
     "speedup_range": [1.1, 9.0], "timing_rounds": 3, "timing_trustworthy": False,
     "timing_note": "8.08x is more than 10% above the ideal 1.43x", "ideal_speedup": 1.43,
     "roofline_speedup": 1.25},
]


def test_speed_charts_have_iqr_error_bars_and_ring_flagged_points():
    fig = sweep_charts.length_chart(SPEED_ROWS)
    measured, flagged = fig.data[0], fig.data[1]
    assert list(measured.x) == [32, 128]  # sorted by length
    assert list(measured.error_y.array) == [9.0 - 8.08, 1.35 - 1.3]
    assert [round(v, 6) for v in measured.error_y.arrayminus] == [round(8.08 - 1.1, 6), 0.05]
    assert list(flagged.x) == [32] and "above the ideal" in flagged.text[0]
    assert {t.name for t in fig.data} >= {"ideal (FLOPs)", "ideal (roofline: FLOPs and bytes)"}
    ratio = sweep_charts.ratio_chart([{**r, "greedy_agreement": 1.0} for r in SPEED_ROWS],
                               "greedy_agreement")
    assert ratio.data[0].error_y.array is not None and ratio.data[1].name.startswith("flagged")


def test_rows_from_before_the_protocol_count_as_flagged():
    import pandas as pd

    from dashboard.panels.generate_speed import sweep_table

    old = [{"length": 32, "prefill_speedup": 1.2, "ideal_speedup": 1.4}]
    fig = sweep_charts.length_chart(old)
    assert fig.data[1].name.startswith("flagged") and list(fig.data[0].error_y.array) == [0]
    table = sweep_table(pd.DataFrame(old + [{**SPEED_ROWS[0], "length": 64}]), "length")
    assert list(table["prefill speedup"]) == ["⚠ 1.20×", "1.30×"] and table["IQR"][0] == "–"


def test_sweep_table_leads_with_length_and_marks_flagged_speed():
    import pandas as pd

    from dashboard.panels.generate_speed import sweep_table

    table = sweep_table(pd.DataFrame(SPEED_ROWS), "length")
    assert list(table.columns[:9]) == ["length", "variant", "skip_ratio", "prefill speedup", "IQR",
                                       "rounds", "ideal_speedup", "roofline_speedup", "timing note"]
    assert list(table["prefill speedup"]) == ["1.30×", "⚠ 8.08×"]
    assert list(table["IQR"]) == ["1.25–1.35", "1.10–9.00"] and list(table["rounds"]) == [5, 3]
    assert list(table["timing note"]) == ["", "8.08x is more than 10% above the ideal 1.43x"]


def test_block_influence_has_its_own_right_axis_title():
    fig = calibrate_charts.importance_chart([1, 2], [2, 1], view=View(
        log=True, bands=False, block_influence={"prefill": [0.1, 0.2], "decode": [0.3, 0.1]}))
    assert fig.layout.yaxis2.title.text.startswith("block influence")
    assert fig.layout.yaxis2.type == "linear", "the log toggle is for importance only"
    assert fig.layout.yaxis.title.text.startswith("importance")


def test_log_axis_draws_zeros_at_a_floor_and_says_so():
    fig = calibrate_charts.importance_chart([0.0, 1e-3, 1e-1], [1e-2, 0.0, 1.0],
                                            view=View(log=True, bands=False))
    means = [t for t in fig.data if t.name.endswith("importance")]
    for t in means:
        assert min(t.y) > 0, "no point below the log axis"
    floor = min(means[0].y)
    assert floor == pytest.approx(1e-4), "a decade below the smallest positive value"
    assert list(means[0].marker.symbol)[0] == "triangle-down"
    assert list(means[0].customdata)[0] == 0.0, "the hover shows the true value"
    assert any(t.name == "0: drawn at the floor" for t in fig.data)


def test_linear_bands_stay_at_or_above_zero():
    fig = calibrate_charts.importance_chart([1.0, 0.5], [0.2, 0.1], [3.0, 2.0], [1.0, 1.0],
                                            View(log=False, bands=True))
    for band in (t for t in fig.data if t.name.endswith("std")):
        assert min(band.y) >= 0.0, band.name


def test_overlays_add_two_lines_per_stored_calibration():
    over = [{"label": f"run {i}", "prefill": [1.0, 2.0], "decode": [2.0, 1.0]} for i in range(5)]
    fig = calibrate_charts.importance_chart([1, 2], [2, 1], view=View(overlays=tuple(over), bands=False))
    names = [t.name for t in fig.data]
    assert sum(n.startswith("run ") for n in names) == 10
    assert "run 3 · decode" in names


def test_attention_heatmap_axis_names_decode_steps():
    fig = drift_charts.drift_heatmap([[1.0, 0.9]], None, "t", x_title="decode step (0 = x_N)")
    assert fig.layout.xaxis.title.text.startswith("decode step")


def test_a_flat_kl_reads_flat():
    """0.14079 vs 0.141137 must not fill the whole axis."""
    fig = drift_charts.decode_steps_chart([0.14079, 0.141137, 0.1409], [1.0, 1.0, 1.0])
    lo, hi = fig.layout.yaxis.range
    assert lo >= 0 and hi - lo >= 0.2 * 0.141
    assert fig.layout.yaxis.tickformat == ".3~g"
    rows = [{"length": n, "hidden_cos": 0.9, "k_cos": 0.8, "v_cos": 0.7, "attn_out_cos": 0.99,
             "kl": kl} for n, kl in ((16, 0.14079), (32, 0.141137))]
    lo, hi = drift_charts.drift_length_chart(rows).layout.yaxis2.range
    assert hi - lo >= 0.2 * 0.141


def test_padded_range_and_floor_helpers():
    from dashboard.charts.axes import clip_to_floor, log_floor, padded_range

    assert log_floor([0.0, 2.0, 5.0]) == pytest.approx(0.2)
    assert log_floor([0.0]) is None
    assert clip_to_floor([0.0, 1.0], 0.1) == ([0.1, 1.0], [0])
    assert padded_range([0.5, 1.0], lower=0.0)[0] >= 0.0
    assert padded_range([]) is None


class _Tok:
    """Decodes id i to PIECES[i]; id 3 is a special token."""

    PIECES = ["Hi", "\n", " \n", "<|im_end|>", "there", "  "]
    all_special_tokens = ["<|im_end|>"]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[i] for i in ids)


def test_outputs_hide_special_tokens_and_cut_blank_line_runs():
    from dashboard.panels.generate_text import readable_pieces, readable_text

    ids = [0, 1, 2, 1, 1, 5, 4, 3]  # "Hi" + 4 newlines (with spaces) + "there" + <|im_end|>
    pieces = readable_pieces(_Tok(), ids)
    assert pieces[-1] == ("<|im_end|>", True)
    assert readable_text(_Tok(), ids) == "Hi\n \nthere"
    assert readable_text(_Tok(), [0, 1, 4]) == "Hi\nthere", "a single newline stays"


def test_quality_charts_carry_95_percent_error_bars():
    rows = [{"variant": "full", "skip_ratio": 0.0, "continuation_nll": 1.0,
             "continuation_nll_ci": [0.9, 1.1], "prefill_speedup": 1.0, "ideal_speedup": 1.0},
            {"variant": "pop", "skip_ratio": 0.33, "continuation_nll": 1.2,
             "continuation_nll_ci": [1.0, 1.5], "prefill_speedup": 1.3, "ideal_speedup": 1.46}]
    fig = sweep_charts.quality_chart(rows, "continuation_nll")
    bars = fig.data[0].error_y
    assert list(bars.array) == pytest.approx([0.1, 0.3]) and list(bars.arrayminus) == pytest.approx([0.1, 0.2])
    ratio = sweep_charts.ratio_chart(rows, "continuation_nll")
    q = next(t for t in ratio.data if t.name.startswith("continuation_nll"))
    assert list(q.error_y.array) == pytest.approx([0.1, 0.3]) and q.yaxis == "y2"


def test_the_ratio_chart_draws_paired_differences_where_the_rows_have_them():
    rows = [{"variant": "full", "skip_ratio": 0.0, "continuation_nll": 1.0, "prefill_speedup": 1.0,
             "ideal_speedup": 1.0},
            {"variant": "pop", "skip_ratio": 0.33, "continuation_nll": 1.2, "prefill_speedup": 1.3,
             "ideal_speedup": 1.46, "continuation_nll_delta": 0.2,
             "continuation_nll_delta_ci": [0.15, 0.26]}]
    fig = sweep_charts.ratio_chart(rows, "continuation_nll", {"ratio": [0, .33], "speedup": [1, 1.37],
                                                              "quality": [.8, .78]})
    q = next(t for t in fig.data if t.name.startswith("continuation_nll: variant − full"))
    assert list(q.y) == [0.0, 0.2] and list(q.error_y.array) == pytest.approx([0, 0.06])
    paper = next(t for t in fig.data if t.name.startswith("paper: accuracy"))
    assert list(paper.y) == pytest.approx([0, -0.02]), "the paper's accuracy as a change from full"
    assert fig.layout.yaxis2.title.text == "continuation_nll: variant − full"
