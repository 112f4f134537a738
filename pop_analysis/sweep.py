"""The paper's experiments on any model: ratio sweep (Table 4), design ablations (Table 3), speed vs
input length (Table 2), and importance-based skip sets against the contiguous last third.

Every row carries a measured prefill speedup (TTFT of the full model / TTFT of the variant,
alternated in one process, medians of `repeats`) beside its quality numbers (evaluate.py).
Results are cached through store.py under kind "sweep", so the CLI fills the dashboard's page.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass

from . import store
from .bench import random_prompt, ttft_once
from .evaluate import EvalSet, evaluate_items, full_references, load_eval_set
from .flops import ideal_speedup
from .models import LoadedModel
from .pop import check_prompt
from .progress import Tracker
from .retrieval import RetrievalConfig, RetrievalError, retrieval_items
from .skipset import SkipSetError, last_block, preset
from .paper import PAPER_TABLES, paper_frame  # noqa: F401 - part of this module's API
from .suggest import lowest

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
}


class SweepError(ValueError):
    """A sweep that cannot run as asked; the message says why."""


@dataclass(frozen=True)
class SweepConfig:
    """What a sweep runs; hashed (with the model and data) for the cache key."""

    dataset: str = "gsm8k"  # gsm8k, wizardlm, retrieval[:LENGTH], builtin, or a file path
    n_samples: int = 8  # evaluation items (per length in the length sweep)
    ratios: tuple[float, ...] = (0, .2, .25, .33, .4, .5, .6)  # ratio sweep: skip the last ratio*L
    variants: tuple[str, ...] = ("full", "pop", "shallow", "interleaved", "pop_no_kv",
                                 "pop_no_boundary", "static")  # ablation sweep rows
    lengths: tuple[int, ...] = (32, 128, 512, 2048)  # length sweep: prompt tokens
    max_new_tokens: int = 32  # greedy tokens compared with the full model
    repeats: int = 3  # timed rounds per speedup (median), after one warm-up round
    bench_tokens: int = 512  # prompt length of the speedup in ratio / ablation / adaptive rows
    task_accuracy: bool = False  # also score GSM8K exact match (wants max_new_tokens ~256)
    retrieval_new_tokens: int = 8  # greedy tokens for the retrieval answer (length sweep)
    seed: int = 0  # retrieval task seed


@dataclass
class SweepRow(store.Record):
    variant: str  # sweep variant name (ABLATIONS key, or "adaptive")
    skip_ratio: float  # len(skip_layers) / L
    skip_layers: list[int]
    prefill_speedup: float  # measured TTFT(full) / TTFT(variant), 1.0 for the full model
    ideal_speedup: float  # POP's FLOP ratio for this skip set at the timed length
    continuation_nll: float  # mean per-token NLL of the reference continuation (NaN: not measured)
    greedy_agreement: float  # mean token match rate with the full model's greedy output
    exact_match: float | None = None  # GSM8K exact match (task_accuracy)
    retrieval_acc: float | None = None  # synthetic retrieval exact match
    kind: str = ""  # which sweep made the row
    length: int | None = None  # prompt tokens of the timing (and of the items in a length sweep)
    n: int = 0  # items behind the quality numbers
    first_divergence: float | None = None  # mean first differing token over diverging items
    sequence_exact: float | None = None  # fraction of greedy outputs identical to the full model's
    teacher_forced_top1: float | None = None  # reference tokens that are the variant's argmax
    ttft_full_ms: float | None = None  # median TTFT of the full model (timed beside the variant)
    ttft_ms: float | None = None  # median TTFT of the variant
    engine_variant: str = ""  # the pop.py variant that ran
    item_tokens: int | None = None  # mean prompt tokens of the retrieval items (length sweep)
    full_continuation_nll: float | None = None  # the full model on the same items (length sweep)
    full_retrieval_acc: float | None = None  # the full model on the same items (length sweep)


@dataclass
class SweepResult(store.Record):
    model: str
    kind: str  # "ratio" | "ablation" | "length" | "adaptive"
    rows: list[dict]
    config: dict
    seconds: float
    data: str = ""  # evaluation set name and fingerprint
    threads: int | None = None  # torch CPU threads during timing
    device: str = ""

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)


# ---------------------------------------------------------------- timing


def measure_speedup(lm: LoadedModel, variant: str, skip, length: int, repeats: int = 3,
                    warmup: int = 1, tick=None) -> tuple[float, float, float]:
    """(speedup, full ms, variant ms): TTFT alternated full / variant, medians after warm-up.

    `tick()` is called after each round (long prompts: keeps a progress bar alive)."""
    check_prompt(lm.adapter, length)
    ids = random_prompt(lm, length)
    full, var = [], []
    for r in range(warmup + max(1, repeats)):
        a, b = ttft_once(lm, ids, "full", skip), ttft_once(lm, ids, variant, skip)
        if r >= warmup:
            full.append(a)
            var.append(b)
        if tick:
            tick()
    f, v = statistics.median(full), statistics.median(var)
    return f / v, f * 1e3, v * 1e3


# ---------------------------------------------------------------- rows


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _row(lm, kind, name, engine, skip, items, refs, cfg, tracker, length, new_tokens,
         answers: str | None) -> SweepRow:
    """Quality of one variant over `items` and its measured speedup at `length` tokens."""
    n_layers = lm.adapter.n_layers
    step = lambda: tracker.step(message=f"{kind}: {name}")  # noqa: E731
    s = evaluate_items(lm, items, engine, skip, refs, new_tokens, step) if items else None
    if engine == "full" or not skip:
        speed, full_ms, var_ms, ideal = 1.0, None, None, 1.0
    else:
        tick = lambda: tracker.step(0, message=f"{kind}: timing {name}")  # noqa: E731
        speed, full_ms, var_ms = measure_speedup(lm, engine, skip, length, cfg.repeats, tick=tick)
        ideal = ideal_speedup(lm.adapter.shape, length, skip)
    tracker.step(message=f"{kind}: timed {name}")
    nan = float("nan")
    return SweepRow(
        variant=name, skip_ratio=len(skip) / n_layers, skip_layers=sorted(skip),
        prefill_speedup=speed, ideal_speedup=ideal,
        continuation_nll=s.continuation_nll if s else nan,
        greedy_agreement=s.greedy_agreement if s else nan,
        exact_match=s.answer_accuracy if s and answers == "exact_match" else None,
        retrieval_acc=s.answer_accuracy if s and answers == "retrieval" else None,
        kind=kind, length=length, n=s.n if s else 0,
        first_divergence=s.first_divergence if s else None,
        sequence_exact=s.sequence_exact if s else None,
        teacher_forced_top1=s.teacher_forced_top1 if s else None,
        ttft_full_ms=full_ms, ttft_ms=var_ms, engine_variant=engine)


def _answers(evalset: EvalSet, cfg: SweepConfig) -> str | None:
    if evalset.kind == "retrieval":
        return "retrieval"
    return "exact_match" if evalset.kind == "gsm8k" and cfg.task_accuracy else None


def _prepare(lm, cfg, evalset, n_rows, progress, message):
    evalset = evalset or load_eval_set(lm, cfg.dataset, cfg.n_samples, seed=cfg.seed)
    items = evalset.items
    tracker = Tracker(len(items) * (n_rows + 1) + n_rows, progress, message)
    refs = full_references(lm, items, cfg.max_new_tokens,
                           lambda: tracker.step(message="full model greedy references"))
    return evalset, items, refs, tracker


def _result(lm, kind, rows, cfg, t0, evalset=None) -> SweepResult:
    data = f"{evalset.name}:{evalset.fingerprint[:12]}" if evalset else "retrieval (synthetic)"
    return SweepResult(lm.name, kind, [r.to_dict() for r in rows], store.plain(dataclasses.asdict(cfg)),
                       time.perf_counter() - t0, data, _threads(), str(lm.device))


# ---------------------------------------------------------------- the four sweeps


def ratio_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None,
                evalset: EvalSet | None = None) -> SweepResult:
    """Table 4: skip the last round(r*L) layers for each ratio r; r = 0 is the full model."""
    t0 = time.perf_counter()
    n_layers = lm.adapter.n_layers
    skips = [last_block(n_layers, float(r)) for r in cfg.ratios]  # raises on a bad ratio
    evalset, items, refs, tracker = _prepare(lm, cfg, evalset, len(skips), progress, "ratio sweep")
    rows = []
    for r, skip in zip(cfg.ratios, skips):
        name, engine = ("full", "full") if not skip else ("pop", "pop")
        row = _row(lm, "ratio", name, engine, skip, items, refs, cfg, tracker, cfg.bench_tokens,
                   cfg.max_new_tokens, _answers(evalset, cfg))
        row.skip_ratio = float(r)  # the ratio asked for; skip_layers says what it rounded to
        rows.append(row)
    return _result(lm, "ratio", rows, cfg, t0, evalset)


def ablation_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None,
                   evalset: EvalSet | None = None) -> SweepResult:
    """Table 3: the paper's design ablations, each at a third of the layers."""
    t0 = time.perf_counter()
    bad = [v for v in cfg.variants if v not in ABLATIONS]
    if bad or not cfg.variants:
        raise SweepError(f"unknown ablation variant(s) {bad}; choose from {', '.join(ABLATIONS)}")
    n_layers = lm.adapter.n_layers
    evalset, items, refs, tracker = _prepare(lm, cfg, evalset, len(cfg.variants), progress,
                                             "ablation sweep")
    rows = []
    for name in cfg.variants:
        engine, preset_name = ABLATIONS[name]
        skip = () if engine == "full" else preset(preset_name, n_layers)
        rows.append(_row(lm, "ablation", name, engine, skip, items, refs, cfg, tracker,
                         cfg.bench_tokens, cfg.max_new_tokens, _answers(evalset, cfg)))
    return _result(lm, "ablation", rows, cfg, t0, evalset)


def length_sweep(lm: LoadedModel, cfg: SweepConfig = SweepConfig(), progress=None) -> SweepResult:
    """Table 2: POP's measured and ideal prefill speedup, one row per prompt length, with the
    synthetic retrieval task at that length as the quality measure for POP and the full model
    (NaN where a length cannot hold the task's instruction and question: ~100 tokens with a
    chat template)."""
    t0 = time.perf_counter()
    if not cfg.lengths or min(cfg.lengths) < 2:
        raise SweepError("the length sweep needs prompt lengths of at least 2 tokens")
    skip = preset("paper", lm.adapter.n_layers)
    sets = {n: _retrieval_or_none(lm, cfg, n) for n in cfg.lengths}
    n_items = sum(len(v) for v in sets.values())
    tracker = Tracker(3 * n_items + 2 * len(cfg.lengths), progress, "length sweep")
    rows = []
    for n, items in sets.items():
        refs = full_references(lm, items, cfg.retrieval_new_tokens,
                               lambda: tracker.step(message=f"length {n}: full references"))
        full = _row(lm, "length", "full", "full", (), items, refs, cfg, tracker, n,
                    cfg.retrieval_new_tokens, "retrieval")
        row = _row(lm, "length", "pop", "pop", skip, items, refs, cfg, tracker, n,
                   cfg.retrieval_new_tokens, "retrieval")
        # One row per length (what Table 2 plots); the full model's quality rides along.
        row.full_continuation_nll, row.full_retrieval_acc = full.continuation_nll, full.retrieval_acc
        if items:
            row.item_tokens = round(statistics.fmean(len(i.prompt_ids) for i in items))
        rows.append(row)
    return _result(lm, "length", rows, cfg, t0)


def _retrieval_or_none(lm, cfg, n) -> list:
    try:
        return retrieval_items(lm, RetrievalConfig(cfg.n_samples, n, seed=cfg.seed))
    except RetrievalError:
        return []  # too short for the task: timing only


def adaptive_skip(scores, k: int) -> tuple[int, ...]:
    """The k layers of lowest prefill importance (ties: the deeper layer first)."""
    if not 0 < k < len(scores):
        raise SkipSetError(f"cannot pick {k} of {len(scores)} layers")
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
    evalset, items, refs, tracker = _prepare(lm, cfg, evalset, 3, progress, "adaptive sweep")
    rows = [_row(lm, "adaptive", name, engine, skip, items, refs, cfg, tracker, cfg.bench_tokens,
                 cfg.max_new_tokens, _answers(evalset, cfg))
            for name, engine, skip in (("full", "full", ()), ("pop", "pop", tail),
                                       ("adaptive", "pop", chosen))]
    return _result(lm, "adaptive", rows, cfg, t0, evalset)


# ---------------------------------------------------------------- cache


def cached_sweep(lm: LoadedModel, kind: str, cfg: SweepConfig = SweepConfig(), use_cache=True,
                 progress=None, calibration=None) -> tuple[SweepResult, bool]:
    """(result, was_hit) for one kind; the key holds the model, device, data and config."""
    if kind not in KINDS:
        raise SweepError(f"unknown sweep kind {kind!r}; choose from {', '.join(KINDS)}")
    evalset = None if kind == "length" else load_eval_set(lm, cfg.dataset, cfg.n_samples,
                                                          seed=cfg.seed)
    params = {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype), "kind": kind,
              "config": dataclasses.asdict(cfg),
              "data": evalset.fingerprint if evalset else "synthetic",
              "calibration": prefill_scores(calibration) if kind == "adaptive" else None}

    def compute() -> dict:
        if kind == "ratio":
            return ratio_sweep(lm, cfg, progress, evalset).to_dict()
        if kind == "ablation":
            return ablation_sweep(lm, cfg, progress, evalset).to_dict()
        if kind == "adaptive":
            return adaptive_sweep(lm, cfg, calibration, progress, evalset).to_dict()
        return length_sweep(lm, cfg, progress).to_dict()

    payload, hit = store.cached("sweep", params, compute, use_cache)
    return SweepResult.from_dict(payload), hit


def list_sweeps() -> list[dict]:
    return store.entries("sweep")


def load_sweep(key: str) -> SweepResult | None:
    payload = store.load("sweep", key)
    try:
        return SweepResult.from_dict(payload) if payload is not None else None
    except TypeError:
        return None


def write_csv(results, path) -> None:
    """Rows of one or more SweepResults as CSV (skip_layers written as '20-29')."""
    import pandas as pd

    from .skipset import describe

    frames = []
    for res in ([results] if isinstance(results, SweepResult) else results):
        df = res.to_frame()
        df.insert(0, "model", res.model)
        df["skip_layers"] = [describe(s) for s in df["skip_layers"]]
        frames.append(df)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
