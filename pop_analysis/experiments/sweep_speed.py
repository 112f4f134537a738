"""The speed part of a sweep row: the timing protocol on a seeded random prompt, or the full
model's own 1.0 (the reference, not timed)."""
from __future__ import annotations

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt
from pop_analysis.speed.bench import PrefillSpeed, random_prompt, time_prefill
from pop_analysis.speed.timing import TimingConfig
from pop_vllm.run_setting import RunSetting

TIMING_PROTOCOL = "swapped-order rounds, median and IQR, flags (v1)"  # part of the cache key


def measure_speedup(lm: LoadedModel, setting: RunSetting, length: int,
                    timing: TimingConfig = TimingConfig(), tick=None) -> PrefillSpeed:
    """The timing protocol on a seeded random prompt of `length` tokens.

    `tick()` is called after each round (long prompts: keeps a progress bar alive)."""
    check_prompt(lm.adapter, length)
    ids = random_prompt(lm, length)  # (1, N)
    return time_prefill(lm, ids, setting, timing,
                        on_round=(lambda done, planned: tick()) if tick else None)


def speed_fields(lm: LoadedModel, setting: RunSetting, length: int, timing: TimingConfig,
                 tick=None) -> dict:
    """SweepRow's speed fields for one setting timed at `length` tokens."""
    if not setting.active:
        return dict(prefill_speedup=1.0, ideal_speedup=1.0, roofline_speedup=1.0,
                    speedup_range=[1.0, 1.0], timing_rounds=0, timing_trustworthy=True,
                    timing_note=None)
    p = measure_speedup(lm, setting, length, timing, tick)
    return dict(prefill_speedup=p.speedup, ideal_speedup=p.ideal_speedup,
                ttft_full_ms=p.timing.full_median_ms, ttft_ms=p.timing.variant_median_ms,
                **p.fields())
