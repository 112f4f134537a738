"""The timing protocol: alternated order, warm-up, rounds, median and IQR of per-round ratios, flags (disagreeing rounds, lock waits, busy machine, above the ideal), bad input."""
from contextlib import contextmanager

import pytest

from pop_analysis.speed.timing import (
    MAX_ROUNDS,
    TimingConfig,
    TimingError,
    check_budget,
    Machine,
    check_rounds,
    measure,
)


class Fake:
    """A clock that moves only when the timed functions (or a lock wait) say so."""

    def __init__(self, full=1.0, variant=0.5):
        self.now = 0.0
        self.calls: list[str] = []
        self.full, self.variant = full, variant  # seconds, or lists consumed per call

    def clock(self) -> float:
        return self.now

    def _take(self, which):
        v = getattr(self, which)
        return v.pop(0) if isinstance(v, list) else v

    def run_full(self):
        self.calls.append("full")
        self.now += self._take("full")

    def run_variant(self):
        self.calls.append("variant")
        self.now += self._take("variant")


def timed(fake, cfg=TimingConfig(warmup=0), ideal=None, on_round=None, **machine):
    machine = {"probe": None, "threads": 2, "cpus": 2, **machine}
    return measure(fake.run_full, fake.run_variant, cfg, ideal=ideal, on_round=on_round,
                   machine=Machine(clock=fake.clock, **machine))


def test_order_is_swapped_every_round_and_the_median_ratio_reported():
    f = Fake()
    t = timed(f, TimingConfig(warmup=1, budget_s=1e-3))
    assert t.rounds == 3, "the minimum of 3 rounds, even when the budget is spent"
    assert f.calls[:2] == ["full", "variant"], "warm-up runs both"
    assert f.calls[2:] == ["full", "variant", "variant", "full", "full", "variant"]
    assert t.first == ["full", "variant", "full"]
    assert t.speedup == pytest.approx(2.0) and (t.low, t.high) == pytest.approx((2.0, 2.0))
    assert t.full_ms == pytest.approx([1000.0] * 3) and t.variant_ms == pytest.approx([500.0] * 3)
    assert t.trustworthy and t.note is None
    assert t.fields() == {"speedup_range": [2.0, 2.0], "timing_rounds": 3,
                          "timing_trustworthy": True, "timing_note": None}


def test_warm_up_is_not_timed():
    f = Fake(full=[9.0, 1.0, 1.0, 1.0], variant=[9.0, 0.5, 0.5, 0.5])  # a slow first call each
    t = timed(f, TimingConfig(warmup=1, budget_s=1e-3))
    assert t.full_ms == pytest.approx([1000.0] * 3) and t.speedup == pytest.approx(2.0)


def test_rounds_follow_the_budget_between_the_minimum_and_the_cap():
    t = timed(Fake(1.0, 0.5), TimingConfig(warmup=0, budget_s=10.0))
    assert t.rounds == 6, "1.5 s rounds: six fit in 10 s, a seventh would not"
    t = timed(Fake(1e-3, 5e-4), TimingConfig(warmup=0, budget_s=10.0, max_rounds=15))
    assert t.rounds == 15, "the cap holds however cheap the rounds"
    t = timed(Fake(), TimingConfig(min_rounds=7, warmup=0, budget_s=1e-3))
    assert t.rounds == 7, "asked-for rounds are a floor"


def test_median_and_interquartile_range_of_per_round_ratios():
    f = Fake(full=1.0, variant=[0.5, 0.4, 0.8, 0.5, 0.5, 1 / 1.5, 0.4])
    t = timed(f, TimingConfig(min_rounds=7, warmup=0, budget_s=1e-3, spread_limit=10))
    assert t.ratios == pytest.approx([2.0, 2.5, 1.25, 2.0, 2.0, 1.5, 2.5])
    # sorted 1.25 1.5 2 2 2 2.5 2.5: median 2, quartiles (linear) 1.75 and 2.25
    assert t.speedup == pytest.approx(2.0) and (t.low, t.high) == pytest.approx((1.75, 2.25))
    assert t.spread == pytest.approx(0.25)


def test_one_hiccup_in_many_rounds_moves_neither_median_nor_iqr():
    f = Fake(full=[1.0] * 8 + [9.0], variant=0.5)  # one round where another process struck
    t = timed(f, TimingConfig(min_rounds=9, warmup=0, budget_s=1e-3))
    assert max(t.ratios) == pytest.approx(18.0)
    assert t.speedup == pytest.approx(2.0) and (t.low, t.high) == pytest.approx((2.0, 2.0))
    assert t.trustworthy


def test_rounds_that_disagree_are_flagged():
    f = Fake(full=1.0, variant=[0.5, 0.7, 0.5])
    t = timed(f, TimingConfig(warmup=0, budget_s=1e-3))
    assert not t.trustworthy and t.note.startswith("rounds disagree"), t.note
    assert "IQR 1.71-2.00x is 14% of the median" in t.note


def test_lock_waits_are_never_timed_and_a_contended_lock_is_flagged():
    f = Fake()
    waits = iter([0.0, 5.0, 0.0, 0.0])  # another run holds the model before round 2

    @contextmanager
    def lock():
        f.now += next(waits)
        yield None

    t = timed(f, TimingConfig(warmup=1, budget_s=1e-3), lock=lock)
    assert t.full_ms == pytest.approx([1000.0] * 3), "the 5 s wait is in no timed interval"
    assert t.speedup == pytest.approx(2.0)
    assert t.lock_contended and t.lock_wait_s == pytest.approx(5.0)
    assert not t.trustworthy and "another run held the model (waited 5.0 s" in t.note


def test_a_lock_that_reports_contention_is_flagged_without_a_wait():
    f = Fake()

    class Held:
        contended = False

    holds = [Held(), Held(), Held()]
    holds[1].contended = True  # someone queued for the model during round 2

    @contextmanager
    def lock():
        yield holds.pop(0)

    t = timed(f, TimingConfig(warmup=0, budget_s=1e-3), lock=lock)
    assert t.lock_contended and t.lock_wait_s == 0 and not t.trustworthy
    free = timed(Fake(), TimingConfig(warmup=0, budget_s=1e-3), lock=lambda: _plain_lock())
    assert free.trustworthy and not free.lock_contended, "a plain lock's True is not contention"


@contextmanager
def _plain_lock():
    yield True  # what threading.Lock().__enter__ returns


def test_a_result_above_the_ideal_is_flagged():
    assert timed(Fake(), ideal=1.9).trustworthy, "2.0x is within 10% of 1.9x"
    t = timed(Fake(), ideal=1.5)
    assert not t.trustworthy and t.note == "2.00x is more than 10% above the ideal 1.50x"


def test_empty_skip_set_reads_one():
    t = timed(Fake(1.0, 1.0), ideal=1.0)
    assert t.speedup == pytest.approx(1.0) and t.trustworthy


def test_a_busy_machine_is_flagged_and_idle_cores_do_not_count():
    f = Fake()
    used = iter([0.0, 3.0])  # others used 3 CPU seconds over the 4.5 s of rounds

    def probe():
        return next(used)

    t = timed(f, TimingConfig(warmup=0, budget_s=1e-3), probe=probe)
    assert t.other_cores == pytest.approx(3.0 / 4.5)
    assert not t.trustworthy and t.note.startswith("machine busy"), t.note
    quiet = iter([0.0, 0.3])
    assert timed(Fake(), TimingConfig(warmup=0, budget_s=1e-3), probe=lambda: next(quiet)).trustworthy
    spare = iter([0.0, 3.0])  # the same use on a 4-CPU machine where we hold 2: idle cores
    assert timed(Fake(), TimingConfig(warmup=0, budget_s=1e-3), probe=lambda: next(spare),
                 cpus=4).trustworthy


def test_several_reasons_share_one_line():
    f = Fake(full=1.0, variant=[0.5, 0.8, 0.5])
    t = timed(f, TimingConfig(warmup=0, budget_s=1e-3), ideal=1.2)
    assert len(t.reasons) == 2 and "\n" not in t.note and "; " in t.note


def test_progress_is_reported_per_round():
    seen = []
    timed(Fake(), TimingConfig(warmup=0, budget_s=1e-3), on_round=lambda d, p: seen.append((d, p)))
    assert [d for d, _ in seen] == [1, 2, 3] and all(p >= 3 for _, p in seen)


@pytest.mark.parametrize("bad", [0, -1, MAX_ROUNDS + 1, 2.5, "3", True])
def test_bad_round_counts_are_one_line_errors(bad):
    with pytest.raises(TimingError, match="timing rounds") as e:
        check_rounds(bad)
    assert "\n" not in str(e.value)
    with pytest.raises(TimingError):
        TimingConfig(min_rounds=bad)


@pytest.mark.parametrize("bad", [0, -2.0, float("nan"), float("inf"), "soon", None])
def test_bad_budgets_are_one_line_errors(bad):
    with pytest.raises(TimingError, match="timing budget"):
        check_budget(bad)


def test_bad_input_runs_nothing():
    f = Fake()
    with pytest.raises(TimingError):
        timed(f, TimingConfig(budget_s=0))
    assert f.calls == []


def test_work_of_our_own_child_processes_is_not_another_s():
    """An engine's worker is our child process: its CPU counts as ours (vLLM benchmarks), while
    the plain probe counts it as another's. A child spins until it has used 0.3 s of CPU."""
    import subprocess
    import sys
    import time

    from pop_analysis.speed.procs import cpu_seconds, descendants
    from pop_analysis.speed.timing import other_cpu_seconds, other_cpu_seconds_but_ours

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nimport sys\n"
                              "sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in descendants()
        deadline = time.monotonic() + 60  # the child's CPU, on a busy machine too
        while cpu_seconds([child.pid]) < 0.3:
            assert time.monotonic() < deadline, "the child never used 0.3 s of CPU"
            time.sleep(0.02)
        plain, ours = other_cpu_seconds(), other_cpu_seconds_but_ours()
        # the two probes differ by the child's CPU (read a moment apart: others' work may add)
        assert plain - ours >= cpu_seconds([child.pid]) - 0.05
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert child.pid not in descendants()
