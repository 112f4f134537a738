"""A step-through of POP on the real model: a short prompt through the full model and through
POP, step by step (prefill, POP's pruned prefill, its boundary step, decode steps, and with
self-healing the healing passes between decode steps: engine/heal.py), with what
each layer computed on which position, the K/V cells it wrote, the FLOPs of the step, its running
time on this machine and, where a step picks a token, the top-k next tokens.

Everything comes from runs of the engine itself: the grid from hooks on the model's modules
(step_log), the call counts from engine.counters in the same run (the tests hold the two equal),
the cache lengths from the run's own cache, the times from further runs without hooks (rounds of
full and POP back to back, the order swapped each round, the TTFT ratio judged by the timing
protocol's rules).

One speed story: each run's bars on the clock are the steps of its median round (the round
whose TTFT is the median TTFT; the round count is odd), so the clock's first-token marks are the
very medians the headline names. Per-step medians would not add up to the median TTFT, and the
clock would then tell another number than the line beside it.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import torch

from pop_analysis.engine.counters import count_calls
from pop_analysis.engine.heal import heal_prompt
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import PromptError, decode_step
from pop_analysis.engine.precision import Configuration, Precision
from pop_analysis.engine.precision import twins as int8_twins
from pop_analysis.inspection.step_frames import frames  # noqa: F401 - part of this module's API
from pop_analysis.inspection.step_log import log_positions
from pop_analysis.progress import Tracker
from pop_analysis.speed.bench import device_clock
from pop_analysis.speed.flops import full_prefill_flops, ideal_speedup
from pop_analysis.speed.precision_speed import ideal as precision_ideal
from pop_analysis.speed.roofline import chunk_ops, embed_ops, head_ops, total_flops
from pop_analysis.speed.timing import Contention, TimingConfig, judge, other_cpu_seconds
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record
from pop_vllm.healing import NO_HEAL, Heal, HealError
from pop_vllm.run_setting import RunSetting

KIND = "stepthrough"
MIN_TOKENS, MAX_TOKENS = 2, 48  # one grid column per token: 48 still read at a projector's width
HEAL_BUDGET = 16  # healing's default positions per step: the example prompt heals in 3 passes
CLOCK = "median round"  # what the clock's bars are (part of the cache key: older records drew
# per-step medians)
RUNS = ("full", "pop")


@dataclass(frozen=True)
class StepConfig:
    """What a step-through runs; every field changes the result."""

    decode_steps: int = 3  # generated tokens after the first (each a decode step)
    rounds: int = 5  # timed rounds of full and POP (after one untimed warm-up); odd: the median
    # TTFT is one round's, whose steps the clock draws
    top_k: int = 5  # next-token candidates shown where a step picks a token
    int8: tuple = ()  # layers whose prompt the POP run reads in int8 (engine/precision.py)
    heal: Heal = NO_HEAL  # the POP run heals its cache after the first token (engine/heal.py)

    def __post_init__(self):
        if not 1 <= self.decode_steps <= 8 or not 3 <= self.rounds <= 15 or not 1 <= self.top_k <= 10 \
                or self.rounds % 2 == 0:
            raise ValueError("decode_steps must lie in 1..8, rounds be odd in 3..15, top_k in 1..10")
        object.__setattr__(self, "int8", Precision(tuple(self.int8)).int8)  # sorted, checked
        if not isinstance(self.heal, Heal):
            raise HealError(f"heal must be a healing.Heal, got {type(self.heal).__name__}")
        if self.heal.budget_ms is not None:  # the recorded run and the timed rounds must take
            raise HealError("a step-through heals by positions per step (eager, or a budget like "
                            "16), not by milliseconds: its steps must be the same in every round")


@dataclass
class StepThrough(Record):
    """One step-through: the steps of both runs in the order they ran, each run's own."""

    model: str
    n_layers: int
    skip_layers: list[int]
    prompt: str  # the text (raw: no chat template)
    prompt_ids: list[int]
    tokens: list[str]  # the prompt's tokens as text
    steps: list[dict]  # see _step(); run "full" or "pop", in the order each run took them
    cache_lengths: dict  # run -> per layer, positions its cache holds at the end
    full_prefill_flops: float  # the full model's prefill, the unit of every step's share
    ideal_speedup: float  # full / POP prefill FLOPs at this prompt length
    ttft: dict  # the timing protocol's verdict on the per-round TTFTs (judge()); with "clock"
    config: dict  # StepConfig
    threads: int  # torch threads the times were measured with
    device: str
    dtype: str
    seconds: float  # wall time of the whole recording


def encode_short(lm: LoadedModel, text: str) -> list[int]:
    """The prompt as token ids, no chat template (a template's system turn alone is longer than
    the grid); refused with one line outside MIN_TOKENS..MAX_TOKENS."""
    if lm.tokenizer is None:
        raise ValueError(f"model {lm.name} has no tokenizer")
    if not text or not text.strip():
        raise PromptError("the prompt is empty: type a short sentence (12-40 tokens read best)")
    if len(text) > 16 * MAX_TOKENS:
        raise PromptError(f"the step-through takes {MIN_TOKENS}-{MAX_TOKENS} tokens; this prompt "
                          f"is {len(text)} characters")
    ids = lm.tokenizer(text, add_special_tokens=True)["input_ids"]
    if not MIN_TOKENS <= len(ids) <= MAX_TOKENS:
        raise PromptError(f"the step-through takes {MIN_TOKENS}-{MAX_TOKENS} tokens; this prompt "
                          f"has {len(ids)}")
    return list(ids)


def pieces(lm: LoadedModel, ids) -> list[str]:
    """Each token as text (its id in brackets for a model without a tokenizer)."""
    if lm.tokenizer is None:
        return [f"[{int(i)}]" for i in ids]
    return [lm.tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids]


def _top(lm: LoadedModel, logits: torch.Tensor, k: int) -> list[list]:
    """[[token id, text, probability] x k] of one position's logits (1, V)."""
    probs = torch.softmax(logits[0].float(), -1)  # (V,)
    p, idx = probs.topk(k)  # (k,), (k,)
    return [[int(i), t, float(q)] for i, t, q in zip(idx.tolist(), pieces(lm, idx.tolist()),
                                                    p.tolist())]


@torch.inference_mode()
def trace(lm: LoadedModel, ids: list[int], run: str, setting: RunSetting,
          cfg: StepConfig) -> tuple[list[dict], list[int]]:
    """One hooked run of `setting`, labelled `run` ("full" or "pop"): its steps (grid, calls,
    picked token, top-k) and, per layer, the positions its cache holds at the end."""
    adapter = lm.adapter
    t = torch.tensor([ids], device=adapter.device)  # (1, N)
    picks = {}
    twins = int8_twins(adapter, setting.precision)
    with count_calls(adapter) as counts, log_positions(adapter, counts, twins) as log:
        first, healer = heal_prompt(adapter, t, setting, counts=counts)
        nxt = first.logits.argmax(-1, keepdim=True)  # (1, 1)
        picks[counts.stage] = (first.logits, nxt)
        for j in range(cfg.decode_steps):
            if healer is not None:  # a pass logged as its own step, "heal j", when one runs
                healer.before_step(j + 1, counts, f"heal {j + 1}")
            counts.stage = f"decode {j + 1}"
            logits = _decode(adapter, first, healer, nxt, j)  # (1, V)
            nxt = logits.argmax(-1, keepdim=True)  # (1, 1)
            picks[counts.stage] = (logits, nxt)
    calls = counts.as_dict()
    steps = []
    for stage in log.stages():
        step = {"run": run, "stage": stage, **log.grid(stage, adapter.n_layers),
                "calls": calls[stage], "token": None, "top": None}
        if stage in picks:
            logits, tok = picks[stage]
            step["token"] = [int(tok), pieces(lm, [int(tok)])[0]]
            step["top"] = _top(lm, logits, cfg.top_k)
        steps.append(step)
    lengths = [adapter.seen_length(first.cache, i) for i in range(adapter.n_layers)]
    return steps, lengths


def _decode(adapter, first, healer, nxt: torch.Tensor, j: int) -> torch.Tensor:
    """Decode step j+1 of a run (through its healer while one heals): logits (1, V)."""
    if healer is not None:
        return healer.decode(nxt, first.position + j)
    return decode_step(adapter, nxt, first.cache, first.position + j)


class _Marks:
    """Stands in for the engine's counters while timing: when each stage began (no hooks)."""

    def __init__(self, clock):
        self.clock, self.marks = clock, []

    @property
    def stage(self):
        return self.marks[-1][0] if self.marks else None

    @stage.setter
    def stage(self, name: str) -> None:
        self.marks.append((name, self.clock()))


@torch.inference_mode()
def _timed(lm: LoadedModel, t: torch.Tensor, setting: RunSetting, cfg: StepConfig,
           clock) -> tuple[list[float], int]:
    """(seconds of each step of one run without hooks, how many of them were the prompt's):
    the prompt's stages, then each healing pass (where `trace` logs one) and decode step."""
    adapter = lm.adapter
    marks = _Marks(clock)
    first, healer = heal_prompt(adapter, t, setting, counts=marks)
    nxt = first.logits.argmax(-1, keepdim=True)  # (1, 1)
    nxt.tolist()  # the token is on the host: the step has ended
    ends = [clock()]
    for j in range(cfg.decode_steps):
        if healer is not None and not healer.finished:
            healer.before_step(j + 1)
            ends.append(clock())
        nxt = _decode(adapter, first, healer, nxt, j).argmax(-1, keepdim=True)
        nxt.tolist()
        ends.append(clock())
    starts = [ts for _, ts in marks.marks] + ends[:1]
    prompt = [b - a for a, b in zip(starts, starts[1:])]  # prefill (and boundary)
    return prompt + [b - a for a, b in zip(ends, ends[1:])], len(prompt)


def time_steps(lm: LoadedModel, ids: list[int], skip, cfg: StepConfig,
               tracker=None) -> tuple[dict, dict]:
    """({run: per step, seconds per round}, the protocol's verdict on the TTFTs)."""
    settings = run_settings(skip, cfg)
    t = torch.tensor([ids], device=lm.adapter.device)  # (1, N)
    clock = device_clock(lm.device)
    times = {run: [] for run in RUNS}
    ttft = {run: [] for run in RUNS}
    first: list[str] = []
    before, t0 = other_cpu_seconds(), clock()
    for r in range(1 + cfg.rounds):  # round 0 is the warm-up
        order = RUNS if r % 2 == 0 else RUNS[::-1]
        for run in order:
            got, n_prompt = _timed(lm, t, settings[run], cfg, clock)
            if r:
                times[run].append(got)
                ttft[run].append(sum(got[:n_prompt]))
        if r:
            first.append("full" if order[0] == "full" else "variant")
        if tracker is not None:
            tracker.step(1, f"timing round {r} of {cfg.rounds}" if r else "warm-up",
                         kind="timing", weight=2)
    wall, after = clock() - t0, other_cpu_seconds()
    other = None if before is None or after is None else max(0.0, after - before) / wall
    ideal = _ideal(lm, len(ids), skip, cfg)
    verdict = judge(ttft["full"], ttft["pop"], first, TimingConfig(),
                    Contention(other, torch.get_num_threads(), os.cpu_count() or 1), ideal)
    return times, {"full_ms": verdict.full_median_ms, "pop_ms": verdict.variant_median_ms,
                   "speedup": verdict.speedup, "low": verdict.low, "high": verdict.high,
                   "rounds": verdict.rounds, "trustworthy": verdict.trustworthy,
                   "note": verdict.note, "ideal": ideal,
                   "clock": {run: median_round(ttft[run]) for run in RUNS}}


def median_round(values: list[float]) -> int:
    """The index of the round whose value is the median (an odd count has one)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


def step_flops(shape, step: dict, n_prompt: int) -> float:
    """Matmul FLOPs of what the step ran (roofline's op list over its grid), the embedding of
    the tokens it brings in and lm_head when it picks a token."""
    ops = []
    for i in range(shape.n_layers):
        for part, kv_only in (("attention", False), ("kv", True), ("int8", False)):
            pos = step[part][i] if part in step else ()
            if pos:
                ops += chunk_ops(shape, i, pos[0], len(pos), kv_only)
    stage = step["stage"]  # prefill embeds the prompt, decode its token; boundary and healing
    new = n_prompt if stage == "prefill" else 0 if stage == "boundary" or stage.startswith("heal") \
        else 1  # reuse rows already embedded
    ops += embed_ops(shape, new) + (head_ops(shape) if step["token"] else [])
    return total_flops(ops)


def record(lm: LoadedModel, ids: list[int], skip, cfg: StepConfig = StepConfig(), prompt: str = "",
           progress=None) -> StepThrough:
    """The step-through of `ids` (MIN_TOKENS..MAX_TOKENS tokens) with skip set `skip`."""
    t0 = time.perf_counter()
    n_layers = lm.adapter.n_layers
    skip = run_settings(skip, cfg)["pop"].check(n_layers).skip  # int8 layers checked with it
    if not MIN_TOKENS <= len(ids) <= MAX_TOKENS:
        raise PromptError(f"the step-through takes {MIN_TOKENS}-{MAX_TOKENS} tokens, got {len(ids)}")
    steps, lengths = [], {}
    tracker = Tracker(len(RUNS) + 1 + cfg.rounds, progress, "recording",
                      plan={"recording": len(RUNS), "timing": 2 * (1 + cfg.rounds)})
    for run in RUNS:
        got, lengths[run] = trace(lm, ids, run, run_settings(skip, cfg)[run], cfg)
        steps += got
        tracker.step(1, f"recorded the {run} run", kind="recording")
    times, ttft = time_steps(lm, ids, skip, cfg, tracker)
    shape = lm.adapter.shape
    for run in RUNS:
        own = [s for s in steps if s["run"] == run]
        start, shown = 0.0, ttft["clock"][run]
        for step, per_round in zip(own, zip(*times[run])):
            ms = [x * 1e3 for x in per_round]  # every round's; the clock draws the median round's
            step.update(times_ms=ms, time_ms=ms[shown], start_ms=start,
                        flops=step_flops(shape, step, len(ids)))
            start += step["time_ms"]
    return StepThrough(
        model=lm.name, n_layers=n_layers, skip_layers=list(skip), prompt=prompt,
        prompt_ids=list(ids), tokens=pieces(lm, ids), steps=steps, cache_lengths=lengths,
        full_prefill_flops=full_prefill_flops(shape, len(ids)),
        ideal_speedup=_ideal(lm, len(ids), skip, cfg), ttft=ttft,
        config=asdict(cfg), threads=torch.get_num_threads(), device=str(lm.device),
        dtype=str(lm.dtype).replace("torch.", ""), seconds=time.perf_counter() - t0)


def _ideal(lm: LoadedModel, n: int, skip, cfg: StepConfig) -> float:
    """The POP run's largest possible TTFT speedup: FLOPs, and int8 layers at their ceiling."""
    if cfg.int8:
        return precision_ideal(lm, n, Configuration("pop", run_settings(skip, cfg)["pop"]))
    return ideal_speedup(lm.adapter.shape, n, RunSetting(skip)) if skip else 1.0


def run_settings(skip, cfg: StepConfig) -> dict[str, RunSetting]:
    """The two runs a step-through shows, by their labels (the POP run's int8 layers from cfg)."""
    return {"full": RunSetting.full(),
            "pop": RunSetting(skip, precision=Precision(cfg.int8), heal=cfg.heal)}


# --- results store ----------------------------------------------------------------------------

def cache_params(lm: LoadedModel, ids, skip, cfg: StepConfig) -> dict:
    config = asdict(cfg)
    if not cfg.int8:
        del config["int8"]  # keys of fp32 runs as before int8 layers existed (stored examples)
    if not cfg.heal.active:
        del config["heal"]  # and of runs without healing as before it existed
    return {"model": lm.name, "card": lm.card(), "prompt_ids": list(ids), "skip": sorted(skip),
            "config": config, "clock": CLOCK}


def cached_stepthrough(lm: LoadedModel, ids, skip, cfg: StepConfig = StepConfig(), prompt: str = "",
                       use_cache: bool = True, notice=None,
                       progress=None) -> tuple[StepThrough, bool]:
    """(result, was_cache_hit): a stored step-through that passes the record checks, or a new one."""
    params = cache_params(lm, ids, skip, cfg)
    key = store.make_key(params)
    if use_cache:
        hit = store.load_record(KIND, key, StepThrough, lm.adapter.n_layers,
                                {"model": lm.name, "prompt_ids": list(ids)}, notice)
        if hit is not None:
            return hit, True
    rec = record(lm, ids, skip, cfg, prompt, progress)
    store.save_or_warn(KIND, key, rec.to_dict(), params, notice)
    return rec, False
