"""A ratio is flagged everywhere it is shown: the Generate headline when its medians disagree with
the rounds, the budgeted choice's line (with the length it was timed at), the session report's
sweep, generation and step-through sections; the examples' quiet wait."""
import json

from dashboard.panels.generate_speed import flags, headline
from dashboard.session import report
from pop_analysis.experiments.choose import measured_text
from pop_analysis.speed.bench import PrefillSpeed
from pop_analysis.speed.quiet import wait_quiet
from pop_analysis.speed.timing import Contention, TimingConfig, judge
from pop_analysis.store import examples as ex


def _speed(full, var) -> PrefillSpeed:
    t = judge(full, var, ["full", "variant"] * 2, TimingConfig(), Contention(0.0, 2, 2), 1.34)
    return PrefillSpeed(12, t, 1.34, 1.12)


def test_a_headline_whose_medians_leave_the_rounds_iqr_is_flagged():
    # Gemma's shipped generation: the protocol trusts 1.05x, its medians give 1.09x
    p = _speed([0.2539, 0.2432, 0.2484, 0.2125], [0.2488, 0.2237, 0.2260, 0.2139])
    assert p.timing.trustworthy
    assert flags(p) == ["the median TTFTs give 1.09×, outside the rounds' IQR 1.01–1.09×"]
    assert headline(p) == "⚠ 1.05×"
    calm = _speed([0.25, 0.25, 0.25, 0.25], [0.2, 0.2, 0.2, 0.2])
    assert flags(calm) == [] and headline(calm) == "1.25×"


def test_the_budget_line_names_the_length_range_and_flag():
    speed = {"prefill_speedup": 1.31, "speedup_range": [1.2, 1.4], "timing_rounds": 3,
             "timing_trustworthy": False,
             "timing_note": "1.31x is more than 10% above the ideal 1.18x"}
    assert measured_text(speed) == (", measured 1.31x (IQR 1.20-1.40, 3 rounds) ⚠ flagged: 1.31x "
                                    "is more than 10% above the ideal 1.18x")
    assert measured_text({**speed, "timing_trustworthy": True}).endswith("3 rounds)")
    assert measured_text({}) == ""


def test_the_session_report_keeps_the_sweeps_flags():
    from pop_analysis.experiments.sweep import SweepResult

    payload = json.loads(ex.example_path("smollm2-135m", "sweep").read_text())["payload"]
    rows = payload["rows"]
    rows[1].update(timing_trustworthy=False, timing_note="machine busy (q)")
    rows[2].update(timing_trustworthy=True, timing_note=None)
    html = report._sweep(SweepResult.from_dict(payload), lambda fig: "")
    assert "machine busy (q)" in html and f"⚠ {rows[1]['prefill_speedup']:.2f}× (flagged)" in html
    assert f"<td>{rows[2]['prefill_speedup']:.2f}×</td>" in html
    assert "1.00× (reference)" in html


def test_the_quiet_wait_returns_once_a_window_is_quiet_or_the_time_is_up():
    clock = [0.0]
    used = iter([0.0, 2.0, 2.0, 2.1, 2.1, 2.1])  # others' CPU seconds: 1 core, then 0.05, then 0

    def sleep(s):
        clock[0] += s

    got = wait_quiet(60, 2, window_s=2.0, cpus=2, probe=lambda: next(used),
                     clock=lambda: clock[0], sleep=sleep)
    assert got[0] and abs(got[1] - 0.05) < 1e-9 and clock[0] == 4.0
    busy = iter([float(i) for i in range(100)])  # one core, always
    clock[0] = 0.0
    ok, cores = wait_quiet(5, 2, window_s=2.0, cpus=2, probe=lambda: next(busy),
                           clock=lambda: clock[0], sleep=sleep)
    assert not ok and cores == 0.5 and clock[0] == 6.0


def test_an_example_whose_medians_leave_the_rounds_iqr_is_not_shipped():
    from pop_analysis.speed.example_timings import problems

    gen = json.loads(ex.example_path("gemma3-270m", "generation").read_text())["payload"]
    p = _speed([0.2539, 0.2432, 0.2484, 0.2125], [0.2488, 0.2237, 0.2260, 0.2139])
    gen["speed"] = p.to_dict()
    assert problems("generation", gen) == [
        "generation TTFT at 12 tokens: 1.05x, but the median TTFTs give 1.09×, outside the "
        "rounds' IQR 1.01–1.09×"]
