"""Timing TTFT of the full model against a variant, through the one protocol in timing.py.

TTFT here is prompt tensor in -> first token id out, on the device, synchronised; for POP it
includes the boundary step (x_N through the rest of the model). Timing does not depend on token
content, so prompts are seeded random ids. Every speed figure the project shows comes from
`time_prefill`: the protocol's median with its range and flag, beside the FLOP ideal and the
roofline ideal (machine.py's measured rates).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from pop_analysis.engine.generate import synchronize
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt, run_prompt
from pop_analysis.speed.flops import ideal_speedup
from pop_analysis.speed.machine import machine_rates
from pop_analysis.speed.roofline import roofline_speedup
from pop_analysis.speed.timing import Machine, Timing, TimingConfig, measure
from pop_vllm.run_setting import RunSetting


def random_prompt(lm: LoadedModel, length: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vocab = lm.adapter.shape.vocab
    ids = torch.randint(min(100, vocab - 1), vocab, (batch, length), generator=g)  # (B, N)
    return ids.to(lm.device)


def device_clock(device):
    """perf_counter after the device has finished its queued work."""
    def clock() -> float:
        synchronize(device)
        return time.perf_counter()
    return clock


def first_token(lm: LoadedModel, ids: torch.Tensor, setting: RunSetting) -> None:
    """One prompt pass up to the first token id on the host (what TTFT times)."""
    run_prompt(lm.adapter, ids, setting).logits.argmax(-1).tolist()


@torch.inference_mode()
def hf_first_token(lm: LoadedModel, ids: torch.Tensor) -> None:
    """The same through HF's own forward (logits for the last position only)."""
    lm.model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1).tolist()


def ideals(lm: LoadedModel, length: int, setting: RunSetting,
           batch: int = 1) -> tuple[float, float]:
    """(FLOP ideal, roofline ideal) of `setting` against the full model at `length` tokens."""
    s = lm.adapter.shape
    if not setting.active:
        return 1.0, 1.0
    rates = machine_rates(lm.device, lm.dtype, torch.get_num_threads(), (s.hidden, s.intermediate))
    b = torch.finfo(lm.dtype).bits // 8 if lm.dtype.is_floating_point else 4
    return (ideal_speedup(s, length, setting),
            roofline_speedup(s, length, setting, rates, b, batch))


@dataclass
class PrefillSpeed:
    """One protocol measurement of prefill speedup, with both ideals."""

    tokens: int  # prompt length timed
    timing: Timing  # the protocol's result (median, range, rounds, flag)
    ideal_speedup: float  # FLOP ideal
    roofline_speedup: float  # roofline ideal on this machine

    @property
    def speedup(self) -> float:
        return self.timing.speedup

    def fields(self) -> dict:
        """The CLI contract's speed keys (beside speedup / prefill_speedup)."""
        return {**self.timing.fields(), "roofline_speedup": round(self.roofline_speedup, 4)}

    def shares(self) -> dict:
        return {"share_of_flop_ideal": round(self.speedup / self.ideal_speedup, 4),
                "share_of_roofline_ideal": round(self.speedup / self.roofline_speedup, 4)}

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "timing": asdict(self.timing),
                "ideal_speedup": self.ideal_speedup, "roofline_speedup": self.roofline_speedup}

    @classmethod
    def from_dict(cls, d: dict) -> "PrefillSpeed":
        return cls(int(d["tokens"]), Timing(**d["timing"]), float(d["ideal_speedup"]),
                   float(d["roofline_speedup"]))


def time_prefill(lm: LoadedModel, ids: torch.Tensor, setting: RunSetting,
                 cfg: TimingConfig = TimingConfig(), lock=None, on_round=None,
                 full=None) -> PrefillSpeed:
    """TTFT of the full model vs `setting` on prompt ids (B, N), through the protocol.

    `lock`: a context-manager factory held per round (the dashboard's model lock); `full`: the
    reference callable (default: our full path; bench's HF comparison passes HF's forward).
    """
    check_prompt(lm.adapter, ids.shape[1])
    n, batch = ids.shape[1], ids.shape[0]
    flop_ideal, roof = ideals(lm, n, setting, batch)
    ref = full or (lambda: first_token(lm, ids, RunSetting.full()))
    here = Machine(clock=device_clock(lm.device), lock=lock, threads=torch.get_num_threads())
    t = measure(ref, lambda: first_token(lm, ids, setting), cfg, machine=here,
                ideal=max(flop_ideal, roof), on_round=on_round)
    return PrefillSpeed(n, t, flop_ideal, roof)


@dataclass
class BenchRow:
    length: int  # prompt tokens
    ttft_full_ms: float  # median over the protocol's rounds
    ttft_pop_ms: float  # median over the protocol's rounds
    speedup: float  # median of the per-round ratios full / pop
    ideal_speedup: float  # from FLOP counts
    roofline_speedup: float  # from FLOPs and bytes at this machine's measured rates
    speedup_range: list[float]  # [lowest, highest] per-round ratio
    timing_rounds: int  # timed rounds
    timing_trustworthy: bool  # no noise flag raised
    timing_note: str | None  # why not, in one line
    share_of_flop_ideal: float  # speedup / ideal_speedup
    share_of_roofline_ideal: float  # speedup / roofline_speedup
    ttft_hf_ms: float | None = None  # HF's own forward (median), when asked

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


BENCH_TIMING = TimingConfig(min_rounds=3, budget_s=10.0)  # bench's default rounds and budget


def bench_length(lm: LoadedModel, length: int, skip, cfg: TimingConfig = BENCH_TIMING,
                 with_hf: bool = False, batch: int = 1) -> BenchRow:
    """The protocol at one prompt length: at least cfg.min_rounds rounds, more while its
    budget lasts."""
    check_prompt(lm.adapter, length)
    ids = random_prompt(lm, length, batch=batch)
    p = time_prefill(lm, ids, RunSetting(skip), cfg)
    hf = None
    if with_hf:  # HF's forward against ours, same protocol; its median is reported
        h = time_prefill(lm, ids, RunSetting.full(), cfg, full=lambda: hf_first_token(lm, ids))
        hf = h.timing.full_median_ms
    t = p.timing
    return BenchRow(length, t.full_median_ms, t.variant_median_ms, t.speedup, p.ideal_speedup,
                    p.roofline_speedup, [round(t.low, 4), round(t.high, 4)], t.rounds, t.trustworthy, t.note,
                    **p.shares(), ttft_hf_ms=hf)


def bench(lm: LoadedModel, lengths, skip, repeats: int = 3, budget_s: float = 10.0,
          with_hf: bool = False, on_row=None) -> list[BenchRow]:
    cfg = TimingConfig(min_rounds=repeats, budget_s=budget_s)  # refuses bad rounds first
    for n in lengths:  # every length is checked before the first one is timed
        check_prompt(lm.adapter, n)
    rows = []
    for n in lengths:
        rows.append(bench_length(lm, n, skip, cfg, with_hf=with_hf))
        if on_row:
            on_row(rows[-1])
    return rows
