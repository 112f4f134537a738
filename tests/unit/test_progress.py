"""Progress, ETA and cancel: measured cost per kind of work, countdown between updates, cancel keeps what finished."""

import pytest

from pop_analysis import progress as prog
from pop_analysis.importance.calibrate import CalibrationConfig, calibrate_ids
from pop_analysis.progress import Cancelled, Monitor, Tracker

from tiny import CancelWhen, tiny_model, tiny_prompt


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(prog.time, "perf_counter", c)
    return c


def test_eta_weights_units_by_their_measured_cost(clock):
    """Ten cheap units (1 s) then two dear ones (10 s): the plain elapsed/done estimate would say
    2 s left after the cheap ones; the tracker says the dear kind is not measured yet, and once
    one dear unit ran it knows 10 s are left."""
    seen = []
    t = Tracker(12, seen.append, plan={"cheap": 10, "dear": 2})
    assert seen[-1].eta_s is None, "nothing measured yet"
    for _ in range(10):
        clock.t += 1.0
        t.step(kind="cheap")
    assert seen[-1].eta_s == 0.0 and seen[-1].unmeasured == ("dear",)
    clock.t += 10.0
    t.step(kind="dear")
    assert seen[-1].eta_s == pytest.approx(10.0) and seen[-1].unmeasured == ()
    assert prog.describe_eta(0.0, ("dear",)) == "under a second left, plus the dear (not timed yet)"


def test_eta_uses_weights_within_a_kind(clock):
    """Prompt steps weighted by their tokens: 100 tokens took 1 s, so 1000 tokens take 10 s."""
    seen = []
    t = Tracker(2, seen.append, plan={"prompt": 1100})
    clock.t += 1.0
    t.step(kind="prompt", weight=100)
    assert seen[-1].eta_s == pytest.approx(10.0)


def test_message_only_steps_do_not_split_a_unit(clock):
    seen = []
    t = Tracker(2, seen.append, plan={"a": 2})
    clock.t += 1.0
    t.step(0, "half way")  # a message inside the unit
    clock.t += 1.0
    t.step(kind="a")
    assert seen[-1].eta_s == pytest.approx(2.0)
    assert seen[-1].message == "half way"


def test_without_a_plan_the_recent_rate_counts(clock):
    seen = []
    t = Tracker(20, seen.append)
    for cost in [0.1] * 10 + [1.0] * prog.RECENT:  # the work got slower
        clock.t += cost
        t.step()
    assert seen[-1].eta_s == pytest.approx(5 * 1.0)


def test_monitor_counts_down_between_updates(clock):
    m = Monitor()
    t = Tracker(4, m, plan={"a": 4})
    clock.t += 2.0
    t.step(kind="a")  # 6 s left
    clock.t += 1.5
    p, elapsed, eta = m.snapshot()
    assert p.done == 1 and eta == pytest.approx(4.5) and elapsed == pytest.approx(3.5)
    clock.t += 100
    assert m.snapshot()[2] == 0.0, "never below zero"


def test_cancel_stops_at_the_next_step():
    m = Monitor()
    t = Tracker(3, m)
    t.step()
    m.cancel()
    with pytest.raises(Cancelled) as e:
        t.step()
    assert e.value.done == 1 and e.value.partial is None and m.cancelled




def test_cancelled_calibration_keeps_finished_batches():
    lm = tiny_model("qwen2", seed=4)
    prompts = [tiny_prompt(n, seed=n) for n in (3, 4, 5, 6, 7, 8)]
    cfg = CalibrationConfig(n_samples=6, max_new_tokens=3, batch_size=2)
    stop = CancelWhen(lambda u: u.message.startswith("batch 2/3 done"))
    with pytest.raises(Cancelled) as e:
        calibrate_ids(lm, prompts, cfg, progress=stop)
    kept = e.value.partial
    full = calibrate_ids(lm, prompts[:4], CalibrationConfig(n_samples=4, max_new_tokens=3,
                                                            batch_size=2))
    assert kept.n_samples == 4 and kept.prompt_tokens == full.prompt_tokens
    assert kept.prefill == pytest.approx(full.prefill, rel=1e-5), "the same four samples"


def test_cancel_before_anything_finished_keeps_nothing():
    lm = tiny_model("qwen2", seed=4)
    stop = CancelWhen(lambda u: True)
    with pytest.raises(Cancelled) as e:
        calibrate_ids(lm, [tiny_prompt(5)], CalibrationConfig(n_samples=1, max_new_tokens=3),
                      progress=stop)
    assert e.value.partial is None
