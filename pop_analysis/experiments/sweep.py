"""The paper's experiments on any model: ratio sweep (Table 4), design ablations (Table 3), speed vs
input length (Table 2), and importance-based skip sets against the contiguous last third.

Every row carries a measured prefill speedup (TTFT of the full model / TTFT of the variant,
through the timing protocol: order swapped every round, median with its IQR, noise flagged)
beside its quality numbers: all variants of a sweep are evaluated together in batches with the
full model's pass shared (evaluate.py), and every quality number has n, a 95% interval and,
against the full model, a paired difference (quality.py). A cancelled sweep keeps its finished rows.
Results are cached through store.py under kind "sweep", so the CLI fills the dashboard's page.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe, last_block, preset
from pop_analysis.errors import InputError
from pop_analysis.experiments.paper import PAPER_TABLES, paper_frame  # noqa: F401 - part of this module's API
from pop_analysis.experiments.sweep_quality import (
    answers_metric,
    evaluate_runs,
    row_quality,
    run_key,
)
from pop_analysis.experiments.sweep_speed import TIMING_PROTOCOL, speed_fields
from pop_analysis.importance.suggest import lowest
from pop_analysis.progress import Tracker, keeping
from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import FULL
from pop_analysis.quality.items import EvalSet
from pop_analysis.quality.retrieval import RetrievalConfig, RetrievalError, retrieval_items
from pop_analysis.quality.summary import too_few_note
from pop_analysis.repair.store import attach, ensure
from pop_analysis.speed.timing import TimingConfig, TimingError
from pop_analysis.store import results as store
from pop_analysis.store.records import check
from pop_analysis.store.schema import Record, SweepRow, plain
from pop_vllm.run_setting import RunSetting, SettingError

KINDS = ("ratio", "ablation", "length", "adaptive")

# Sweep variant name -> (engine variant in pop.py, skip-set preset). Shallow and interleaved are
# POP with another third of the layers; the rest use the paper's last third.
ABLATIONS = {
    "full": ("full", "none"),
    "pop": ("pop", "paper"),
    "shallow": ("pop", "shallow"),
    "interleaved": ("pop", "interleaved"),
    "pop_no_kv": ("pop_no_kv", "paper"),
    "pop_no_boundary": ("pop_no_boundary", "paper"),
    "static": ("static", "paper"),
    "pop_repair": ("pop_repair", "paper"),  # needs SweepConfig.repair
}

# Items per sweep by default: enough that the 95% interval of POP's NLL difference from the full
# model on GSM8K answers is narrower than 0.05 nats on the embedded model (docs/evaluation.md).
DEFAULT_SAMPLES = 64


class SweepError(InputError):
    """A sweep that cannot run as asked; the message says why."""


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep runs; hashed (with the model and data) for the cache key."""

    dataset: str = "gsm8k"  # gsm8k, wizardlm, retrieval[:LENGTH], builtin, or a file path
    n_samples: int = DEFAULT_SAMPLES  # evaluation items (per length in the length sweep)
    ratios: tuple[float, ...] = (0, .2, .25, .33, .4, .5, .6)  # ratio sweep: skip the last ratio*L
    variants: tuple[str, ...] = ("full", "pop", "shallow", "interleaved", "pop_no_kv",
                                 "pop_no_boundary", "static")  # ablation sweep rows
    lengths: tuple[int, ...] = (32, 128, 512, 2048)  # length sweep: prompt tokens
    max_new_tokens: int = 32  # greedy tokens compared with the full model
    greedy: bool = True  # greedy decoding (agreement, answers); False: teacher-forced metrics only
    repeats: int = 3  # fewest timed rounds per speedup (the protocol runs at least 3)
    timing_budget_s: float = 2.0  # more rounds per speedup while they fit in this many seconds
    bench_tokens: int = 512  # prompt length of the speedup in ratio / ablation / adaptive rows
    task_accuracy: bool = False  # also score GSM8K exact match (wants max_new_tokens ~256)
    retrieval_new_tokens: int = 8  # greedy tokens for the retrieval answer (length sweep)
    seed: int = 0  # retrieval task seed
    repair: str | None = None  # K/V repair key or "auto": adds pop_repair rows (ratio sweep)




@dataclass
class SweepResult(Record):
    model: str
    kind: str  # "ratio" | "ablation" | "length" | "adaptive"
    rows: list[dict]
    config: dict
    seconds: float
    data: str = ""  # evaluation set name and fingerprint
    threads: int | None = None  # torch CPU threads during timing
    device: str = ""
    notes: list = field(default_factory=list)  # e.g. fewer items than asked for, no intervals

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)


# ---------------------------------------------------------------- rows

def timing_config(cfg: SweepConfig):
    """The timing protocol's settings for a sweep's rows; SweepError on impossible ones."""
    try:
        return TimingConfig(min_rounds=cfg.repeats, budget_s=cfg.timing_budget_s)
    except TimingError as e:
        raise SweepError(str(e)) from None


@dataclass(frozen=True)
class _Rows:
    """What every row of one sweep shares: the model, the sweep's kind, its config (timing
    and bench length) and its progress tracker."""

    lm: LoadedModel
    kind: str
    cfg: SweepConfig
    tracker: Tracker

    def row(self, name, setting: RunSetting, quality: dict, length: int | None = None) -> SweepRow:
        """One setting's quality fields (`row_quality`; {} without items) and its measured
        speedup at `length` tokens (default: the config's bench length)."""
        kind, tracker = self.kind, self.tracker
        length = self.cfg.bench_tokens if length is None else length
        tick = lambda: tracker.step(0, message=f"{kind}: timing {name}")  # noqa: E731
        speed = speed_fields(self.lm, setting, length, timing_config(self.cfg), tick)
        timed = setting.active  # the tracker plan's "timing" work
        tracker.step(message=f"{kind}: timed {name}", kind="timing" if timed else None,
                     weight=length)
        q = dict(quality)
        declared = {f.name for f in dataclasses.fields(SweepRow)}
        nan = float("nan")
        return SweepRow(
            variant=name, skip_ratio=len(setting.skip) / self.lm.adapter.n_layers,
            skip_layers=list(setting.skip), **speed,
            continuation_nll=q.pop("continuation_nll", nan),
            greedy_agreement=q.pop("greedy_agreement", nan), kind=kind, length=length,
            engine_variant=str(setting.variant),
            **{k: q.pop(k) for k in list(q) if k in declared}, intervals=q)


def _prepare(lm: LoadedModel, cfg, evalset, runs, progress, message):
    """(evalset, scores, tracker) for `runs`, a list of RunSettings."""
    timing_config(cfg)  # bad timing settings fail before any evaluation
    evalset = evalset or load_eval_set(lm, cfg.dataset, cfg.n_samples, seed=cfg.seed)
    n_eval = len({run_key(s) for s in runs} | {FULL.name})
    n, w = len(evalset.items), cfg.bench_tokens  # ETA: costs by kind, weighted by tokens
    tracker = Tracker(n * n_eval + len(runs), progress, message, plan={
        "evaluation": n * n_eval * w, "timing": sum(w for s in runs if s.active)})
    greedy = cfg.greedy or evalset.kind == "retrieval"  # retrieval answers need generation
    scores = evaluate_runs(lm, evalset.items, runs, cfg.max_new_tokens,
                           tracker.costed("evaluation", cfg.bench_tokens), message, greedy)
    return evalset, scores, tracker


@contextlib.contextmanager
def _kept(lm: LoadedModel, kind, cfg, t0, evalset=None):
    """The rows list of a sweep; a cancellation carries a result of the rows finished (or None)."""
    rows: list = []
    with keeping(lambda: _result(lm, kind, rows, cfg, t0, evalset) if rows else None):
        yield rows


def _result(lm: LoadedModel, kind, rows, cfg, t0, evalset=None) -> SweepResult:
    import torch

    data = f"{evalset.name}:{evalset.fingerprint[:12]}" if evalset else "retrieval (synthetic)"
    notes = [evalset.note] if evalset and evalset.note else []
    notes += sorted({too_few_note(r.n) for r in rows if 0 < r.n < 2})
    return SweepResult(lm.name, kind, [r.to_dict() for r in rows], plain(dataclasses.asdict(cfg)),
                       time.perf_counter() - t0, data, torch.get_num_threads(), str(lm.device), notes)


# ---------------------------------------------------------------- the four sweeps

def ratio_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None,
                evalset: EvalSet | None = None, repairs: dict | None = None) -> SweepResult:
    """Table 4: skip the last round(r*L) layers for each ratio r; r = 0 is the full model."""
    t0 = time.perf_counter()
    n_layers = lm.adapter.n_layers
    skips = [last_block(n_layers, float(r)) for r in cfg.ratios]  # raises on a bad ratio
    named = [(r, RunSetting(s, v)) for r, s in zip(cfg.ratios, skips)
             for v in (("pop", "pop_repair") if s and cfg.repair else ("pop" if s else "full",))]
    runs = [setting for _, setting in named]
    attach_repairs(lm, "ratio", cfg, repairs)
    evalset, scores, tracker = _prepare(lm, cfg, evalset, runs, progress, "ratio sweep")
    answers, n = answers_metric(evalset, cfg.task_accuracy), len(evalset.items)
    maker = _Rows(lm, "ratio", cfg, tracker)
    with _kept(lm, "ratio", cfg, t0, evalset) as rows:
        for r, setting in named:
            row = maker.row(str(setting.variant), setting,
                            row_quality(scores, run_key(setting), n, answers))
            row.skip_ratio = float(r)  # the ratio asked for; skip_layers says what it rounded to
            rows.append(row)
    return _result(lm, "ratio", rows, cfg, t0, evalset)


def repair_skips(n_layers: int, kind: str, cfg: SweepConfig) -> list[tuple[int, ...]]:
    """The skip sets whose pop_repair rows need a K/V repair (the sweep's plan, nothing run)."""
    if kind == "ratio" and cfg.repair:
        return [s for s in (last_block(n_layers, float(r)) for r in cfg.ratios) if s]
    if kind == "ablation" and "pop_repair" in cfg.variants:
        return [preset("paper", n_layers)]
    return []


def prepare_repairs(lm: LoadedModel, kind: str, cfg: SweepConfig, progress=None) -> dict:
    """Before a sweep runs: load (or fit and store) the repair of each skip set its pop_repair
    rows use, as {skip set: Repair}. The sweep itself only attaches what it is given."""
    skips = repair_skips(lm.adapter.n_layers, kind, cfg)
    if skips and not cfg.repair:
        raise SweepError("pop_repair rows need a repair (--repair KEY or --repair auto)")
    return {describe(s): ensure(lm, s, cfg.repair, progress) for s in skips}


def attach_repairs(lm: LoadedModel, kind: str, cfg: SweepConfig, repairs: dict | None) -> dict:
    """Attach the planned repairs (prepared first when the caller gave none): {skip set: key}."""
    repairs = prepare_repairs(lm, kind, cfg) if repairs is None else repairs
    for skip in repair_skips(lm.adapter.n_layers, kind, cfg):
        if describe(skip) not in repairs:
            raise SweepError(f"no repair prepared for layers {describe(skip)}")
        attach(lm, repairs[describe(skip)], skip)
    return {name: rep.key for name, rep in repairs.items()}


def ablation_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None,
                   evalset: EvalSet | None = None, repairs: dict | None = None) -> SweepResult:
    """Table 3: the paper's design ablations, each at a third of the layers."""
    t0 = time.perf_counter()
    bad = [v for v in cfg.variants if v not in ABLATIONS]
    if bad or not cfg.variants:
        raise SweepError(f"unknown ablation variant(s) {bad}; choose from {', '.join(ABLATIONS)}")
    n_layers = lm.adapter.n_layers
    runs = [RunSetting(() if ABLATIONS[v][0] == "full" else preset(ABLATIONS[v][1], n_layers),
                       ABLATIONS[v][0]) for v in cfg.variants]
    attach_repairs(lm, "ablation", cfg, repairs)
    evalset, scores, tracker = _prepare(lm, cfg, evalset, runs, progress, "ablation sweep")
    answers, n = answers_metric(evalset, cfg.task_accuracy), len(evalset.items)
    maker = _Rows(lm, "ablation", cfg, tracker)
    with _kept(lm, "ablation", cfg, t0, evalset) as rows:
        for name, setting in zip(cfg.variants, runs):
            rows.append(maker.row(name, setting, row_quality(scores, run_key(setting), n, answers)))
    return _result(lm, "ablation", rows, cfg, t0, evalset)


def length_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None) -> SweepResult:
    """Table 2: POP's measured and ideal prefill speedup, one row per prompt length, with the
    synthetic retrieval task at that length as the quality measure for POP, the full model's
    score on the same items beside it (NaN where a length cannot hold the task's instruction and
    question: ~100 tokens with a chat template)."""
    t0 = time.perf_counter()
    if not cfg.lengths or min(cfg.lengths) < 2:
        raise SweepError("the length sweep needs prompt lengths of at least 2 tokens")
    timing_config(cfg)
    pop = RunSetting(preset("paper", lm.adapter.n_layers))
    sets = {n: _retrieval_or_none(lm, cfg, n) for n in cfg.lengths}
    n_items = sum(len(v) for v in sets.values())
    plan = {"evaluation": 2.0 * sum(n * len(v) for n, v in sets.items()),
            "timing": float(sum(cfg.lengths))}  # weights in tokens: 2048 is not 32
    tracker = Tracker(2 * n_items + len(cfg.lengths), progress, "length sweep", plan=plan)
    maker = _Rows(lm, "length", cfg, tracker)
    with _kept(lm, "length", cfg, t0) as rows:
        for n, items in sets.items():
            scores = evaluate_runs(lm, items, [pop], cfg.retrieval_new_tokens,
                                   tracker.costed("evaluation", n), f"length {n}")
            quality = row_quality(scores, run_key(pop), len(items), "retrieval_acc")
            row = maker.row("pop", pop, quality, n)
            if items:
                row.item_tokens = round(statistics.fmean(len(i.prompt_ids) for i in items))
            rows.append(row)
    return _result(lm, "length", rows, cfg, t0)


def _retrieval_or_none(lm: LoadedModel, cfg, n) -> list:
    try:
        return retrieval_items(lm, RetrievalConfig(cfg.n_samples, n, seed=cfg.seed))
    except RetrievalError:
        return []  # too short for the task: timing only


def adaptive_skip(scores, k: int) -> tuple[int, ...]:
    """The k layers of lowest prefill importance (ties: the deeper layer first)."""
    if not 0 < k < len(scores):
        raise SettingError(f"cannot pick {k} of {len(scores)} layers")
    return tuple(lowest(scores, k))


def prefill_scores(calibration) -> list[float]:
    """Per-layer prefill importance from a CalibrationResult, its dict, or a plain list."""
    if isinstance(calibration, dict):
        scores = calibration.get("prefill")
    elif isinstance(calibration, (list, tuple)):
        scores = calibration
    else:
        scores = getattr(calibration, "prefill", None)
    if not scores or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in scores):
        raise SweepError("the calibration result holds no finite per-layer prefill importance")
    return [float(x) for x in scores]


def adaptive_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), calibration=None,
                   progress=None, evalset: EvalSet | None = None) -> SweepResult:
    """Importance-based skip set (k lowest prefill scores) vs the contiguous last third, equal k."""
    t0 = time.perf_counter()
    scores = prefill_scores(calibration)
    n_layers = lm.adapter.n_layers
    if len(scores) != n_layers:
        raise SweepError(f"calibration has {len(scores)} layers, the model {n_layers}")
    tail = preset("paper", n_layers)
    chosen = adaptive_skip(scores, len(tail))
    named = (("full", RunSetting.full()), ("pop", RunSetting(tail)),
             ("adaptive", RunSetting(chosen)))
    runs = [setting for _, setting in named]
    evalset, scores, tracker = _prepare(lm, cfg, evalset, runs, progress, "adaptive sweep")
    answers, n = answers_metric(evalset, cfg.task_accuracy), len(evalset.items)
    maker = _Rows(lm, "adaptive", cfg, tracker)
    with _kept(lm, "adaptive", cfg, t0, evalset) as rows:
        for name, setting in named:
            rows.append(maker.row(name, setting, row_quality(scores, run_key(setting), n, answers)))
    return _result(lm, "adaptive", rows, cfg, t0, evalset)


# ---------------------------------------------------------------- cache

def cached_sweep(lm: LoadedModel, kind: str, cfg: SweepConfig = SweepConfig(), use_cache=True,
                 progress=None, calibration=None, notice=None,
                 compute_missing: bool = True) -> tuple[SweepResult | None, bool]:
    """(result, was_hit) for one kind; the key holds the model, device, data and config.
    notice(line) hears about an ignored entry or a cache that cannot be written. With
    compute_missing=False a miss gives (None, False) instead of running the sweep. The repairs
    of pop_repair rows are prepared here, before anything runs (prepare_repairs)."""
    if kind not in KINDS:
        raise SweepError(f"unknown sweep kind {kind!r}; choose from {', '.join(KINDS)}")
    evalset = None if kind == "length" else load_eval_set(lm, cfg.dataset, cfg.n_samples,
                                                          seed=cfg.seed)
    timing_config(cfg)  # bad timing settings fail here, before any evaluation
    repairs = prepare_repairs(lm, kind, cfg, progress)
    repair_keys = {name: rep.key for name, rep in repairs.items()} or None
    params = {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype), "kind": kind,
              "config": dataclasses.asdict(cfg), "timing": TIMING_PROTOCOL,
              "data": evalset.fingerprint if evalset else "synthetic",
              "calibration": prefill_scores(calibration) if kind == "adaptive" else None,
              "repairs": repair_keys}  # None without pop_repair rows

    def compute() -> dict:
        if kind == "ratio":
            return ratio_sweep(lm, cfg, progress, evalset, repairs).to_dict()
        if kind == "ablation":
            return ablation_sweep(lm, cfg, progress, evalset, repairs).to_dict()
        if kind == "adaptive":
            return adaptive_sweep(lm, cfg, calibration, progress, evalset).to_dict()
        return length_sweep(lm, cfg, progress).to_dict()

    expect = {"model": lm.name, "kind": kind}
    checked = lambda p: check("sweep", SweepResult, p, lm.adapter.n_layers, expect)  # noqa: E731
    if not compute_missing:
        payload = store.load("sweep", store.make_key(params), checked, notice)
        return (SweepResult.from_dict(payload), True) if payload is not None else (None, False)
    payload, hit = store.cached("sweep", params, compute, use_cache, checked, notice)
    return SweepResult.from_dict(payload), hit


def list_sweeps() -> list[dict]:
    return store.entries("sweep")


def load_sweep(key: str) -> SweepResult | None:
    return store.load_record("sweep", key, SweepResult)


def write_csv(results, path) -> None:
    """Rows of one or more SweepResults as CSV (skip_layers written as '20-29')."""
    import pandas as pd

    from pop_analysis.engine.skipset import describe

    frames = []
    for res in ([results] if isinstance(results, SweepResult) else results):
        df = res.to_frame()
        df.insert(0, "model", res.model)
        df["skip_layers"] = [describe(s) for s in df["skip_layers"]]
        frames.append(df)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
