"""Every importance method on the same prompts, side by side, and their rank agreement.

The methods fall into parts by how they are computed, and each part runs once for all its
methods: the gate calibration (gate Fisher and gate Taylor from one backward; stored as a
calibration, so the Calibrate page sees it), one forward with hooks (Block Influence, angular
distance, sub-layer cosine, relative magnitude), prefill-only drop-one (the batched evaluation of
quality/evaluate.py with one POP variant per layer, each run from its own layer up over the full
model's shared trunk), and the zero-cost baselines. Parts are stored in the results store as
they finish ("importance_part"), the assembled result as "importance".
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from pop_analysis.data.prompts import PromptOrigin
from pop_analysis.engine.generate import encode
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt
from pop_analysis.experiments.methods_store import check_part, check_result
from pop_analysis.importance.calibrate import (
    CalibrationConfig,
    cached_calibration,
    calibrate_ids,
    shape_record,
    used_fingerprint,
)
from pop_analysis.importance.compare import RESAMPLES, agreement
from pop_analysis.importance.hooks_pass import TOKENS, forward_metrics
from pop_analysis.importance.methods import METHODS, MethodError, series_keys
from pop_analysis.importance.picks import random_scores, tail_scores
from pop_analysis.progress import Tracker
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.items import EvalItem
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record, plain
from pop_vllm.run_setting import RunSetting

KIND, PART_KIND = "importance", "importance_part"
PARTS = {"gate": ("gate", "taylor"), "hooks": ("bi", "angular", "sublayer", "magnitude"),
         "dropone": ("dropone",)}


@dataclass(frozen=True)
class ImportanceConfig:
    """What an importance run computes; every field is part of its store key."""

    methods: tuple[str, ...] = tuple(METHODS)  # registry names (methods.py)
    n_samples: int = 32  # prompts (the first n of the set), the same for every method
    new_tokens: int = 32  # gate: sampled response bound; drop-one: the full model's greedy continuation
    seed: int = 0  # the gate's sampling seed and the random baseline's
    raw: bool = False  # tokenise prompts as is, no chat template
    resamples: int = RESAMPLES  # bootstrap resamples of the agreement intervals

    def __post_init__(self):
        if not self.methods:
            raise MethodError("no importance method chosen")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise MethodError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}")
        if self.n_samples < 1:
            raise MethodError(f"importance needs at least one prompt, got {self.n_samples}")
        if self.new_tokens < 1 or self.resamples < 0:
            raise MethodError("new_tokens must be >= 1 and resamples >= 0")


@dataclass
class ImportanceResult(Record):
    """Per-layer scores of every method asked for (larger = more important) and their agreement."""

    model: str
    dataset: str
    n_samples: int
    n_layers: int
    methods: list[str]
    series: dict  # "<method>.<series>" -> per-layer mean, [L]
    samples: dict  # measured series -> per prompt, [n][L] (baselines have none)
    agreement: dict  # compare.Agreement as a dict (names = the keys of series)
    seconds: dict  # part -> wall time (0 for a part loaded from the store)
    config: dict  # ImportanceConfig as a dict
    triangle: list | None = None  # angular distance d(l, n), [l][n-1] for n = 1..L-l, mean over prompts
    tokens: dict = field(default_factory=dict)  # part -> which tokens its methods read
    prompt_tokens: list = field(default_factory=list)  # per prompt
    fingerprint: str = ""  # of the prompt texts used
    shape: dict | None = None  # adapter.Shape (ideal speedups)
    stored: dict = field(default_factory=dict)  # part -> "stored" / "computed"


def parts_for(methods) -> list[str]:
    return [p for p, ms in PARTS.items() if any(m in methods for m in ms)]


def run_importance(lm: LoadedModel, prompt_ids: list[list[int]],
                   cfg: ImportanceConfig = ImportanceConfig(), progress=None,
                   origin: PromptOrigin = PromptOrigin(), gate=None,
                   cached=None) -> ImportanceResult:
    """Every method of cfg on the first cfg.n_samples prompts (token ids).

    gate(): the CalibrationResult to use (default: calibrate_ids on these prompts); cached(part,
    compute): a part's samples from the store, else compute() (default: always compute).
    """
    prompt_ids = [list(p) for p in prompt_ids[:cfg.n_samples]]
    if not prompt_ids:
        raise MethodError("no prompts to rank layers on: the prompt set is empty")
    for p in prompt_ids:
        check_prompt(lm.adapter, len(p), cfg.new_tokens)
    cached = cached or (lambda part, compute: (compute(), False))
    samples, seconds, stored = {}, {}, {}
    for part in parts_for(cfg.methods):
        t0 = time.perf_counter()
        if part == "gate":
            got, hit = _gate_samples(gate or (lambda: calibrate_ids(lm, prompt_ids, _cal_config(cfg),
                                                                    progress)))
        else:
            compute = {"hooks": lambda: _hook_samples(lm, prompt_ids, progress),
                       "dropone": lambda: drop_one(lm, prompt_ids, cfg.new_tokens, progress)}[part]
            got, hit = cached(part, compute)
        keep = set(cfg.methods) | ({"triangle"} if "angular" in cfg.methods else set())
        samples.update({k: v for k, v in got.items() if k.split(".")[0] in keep})
        seconds[part] = 0.0 if hit else time.perf_counter() - t0
        stored[part] = "stored" if hit else "computed"
    return _assemble(lm, cfg, prompt_ids, samples, seconds, stored, origin)


TOKEN_NOTES = {"gate": "the prompt (prefill gates: all but its last token) and a response the "
                       "model samples itself (decode gates: the last prompt token and the "
                       "response)",
               "hooks": TOKENS,
               "dropone": "the prompt through the pruned prefill, then the full model's greedy "
                          "continuation teacher-forced and scored"}


def _cal_config(cfg: ImportanceConfig) -> CalibrationConfig:
    return CalibrationConfig(n_samples=cfg.n_samples, max_new_tokens=cfg.new_tokens,
                             seed=cfg.seed, raw=cfg.raw)


def _gate_samples(gate) -> tuple[dict, bool]:
    """gate.* and taylor.* per-sample matrices from a calibration: (dL/dg)² and |dL/dg|."""
    res = gate()
    hit = isinstance(res, tuple) and res[1]
    res = res[0] if isinstance(res, tuple) else res
    out = {}
    for stage in ("prefill", "decode"):
        sq = np.asarray(getattr(res, f"{stage}_samples"), dtype=float)  # (n, L)
        out[f"gate.{stage}"], out[f"taylor.{stage}"] = sq, np.sqrt(sq)
    return out, hit


def _hook_samples(lm: LoadedModel, prompt_ids, progress) -> dict:
    tracker = Tracker(len(prompt_ids), progress, "forward with hooks")
    got = forward_metrics(lm, prompt_ids, tick=lambda k: tracker.step(k, "forward with hooks"))
    tri = got.pop("triangle").numpy()  # (n, L, L)
    out = {k: v.numpy() for k, v in got.items()}
    with warnings.catch_warnings():  # cells off the triangle are NaN in every prompt: stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        out["triangle"] = np.nanmean(tri, axis=0)  # (L, L)
    return out


def drop_one(lm: LoadedModel, prompt_ids, new_tokens: int, progress=None) -> dict:
    """Per prompt and layer: the NLL increase and KL(full ‖ pruned) of the full model's greedy
    continuation when that layer alone is skipped POP-style for the prompt, (n, L) each."""
    L = lm.adapter.n_layers
    items = [EvalItem(tuple(p)) for p in prompt_ids]
    variants = [Arm(f"drop {i}", RunSetting((i,))) for i in range(L)]
    tracker = Tracker(len(items) * L, progress, "drop-one")
    scores = evaluate_variants(lm, items, variants, new_tokens, generate=False,
                               step=lambda k: tracker.step(k, "drop-one"))
    full = np.asarray(scores["full"].continuation_nll, dtype=float)  # (n,)
    nll = np.stack([np.asarray(scores[v.name].continuation_nll, dtype=float) for v in variants], 1)
    kl = np.stack([np.asarray(scores[v.name].next_token_kl, dtype=float) for v in variants], 1)
    return {"dropone.nll": nll - full[:, None], "dropone.kl": kl}  # (n, L) each


def _assemble(lm: LoadedModel, cfg, prompt_ids, samples, seconds, stored,
              origin: PromptOrigin) -> ImportanceResult:
    """The result record; seconds and stored are per part (what each cost, where it came
    from), in run order."""
    L = lm.adapter.n_layers
    tokens = {part: TOKEN_NOTES[part] for part in seconds}  # what each part read
    tri = samples.pop("triangle", None)
    means = {}
    for key in series_keys(cfg.methods):
        if key in samples:
            means[key] = samples[key].mean(0).tolist()
        elif key == "tail.depth":
            means[key] = tail_scores(L)
        elif key == "random.draw":
            means[key] = random_scores(L, cfg.seed)
    agree = agreement(means, samples, cfg.resamples, cfg.seed)
    return ImportanceResult(
        model=lm.name, dataset=origin.dataset, n_samples=len(prompt_ids), n_layers=L,
        methods=list(cfg.methods), series=means, samples={k: v.tolist() for k, v in samples.items()},
        agreement=dataclasses.asdict(agree), seconds=seconds, config=plain(cfg),
        triangle=None if tri is None else [[None if np.isnan(x) else float(x) for x in row[:L - l]]
                                           for l, row in enumerate(tri)],
        tokens=tokens, prompt_tokens=[len(p) for p in prompt_ids], fingerprint=origin.fingerprint,
        shape=shape_record(lm.adapter.shape), stored=stored)


# --- results store ---------------------------------------------------------------------------

def _params(lm: LoadedModel, prompts, cfg: ImportanceConfig, **extra) -> dict:
    return {"model": lm.name, "card": lm.card(), "dataset": prompts.name,
            "fingerprint": used_fingerprint(prompts, _cal_config(cfg)),
            "n_samples": min(cfg.n_samples, len(prompts.prompts)), "raw": cfg.raw, **extra}


def cached_importance(lm: LoadedModel, prompts, cfg: ImportanceConfig = ImportanceConfig(),
                      use_cache=True, progress=None, notice=None, compute_missing=True):
    """(result, was_hit) for a PromptSet: the stored run, else computed from stored parts where
    they exist (each part stored as it finishes) and stored; with compute_missing=False a miss
    gives (None, False)."""
    params = _params(lm, prompts, cfg, config=dataclasses.asdict(cfg))
    key = store.make_key(params)
    L = lm.adapter.n_layers
    if use_cache:
        hit = store.load(KIND, key, lambda p: check_result(p, ImportanceResult, L), notice)
        if hit is not None:
            return ImportanceResult.from_dict(hit), True
    if not compute_missing:
        return None, False
    ids = [encode(lm, text, raw=cfg.raw) for text in prompts.prompts[:cfg.n_samples]]

    def cached(part, compute):
        extra = {"new_tokens": cfg.new_tokens} if part == "dropone" else {}
        pkey = store.make_key(_params(lm, prompts, cfg, part=part, **extra))
        payload = store.load(PART_KIND, pkey, lambda p: check_part(p, L, len(ids)), notice) \
            if use_cache else None
        if payload is not None:
            return {k: np.asarray(v, dtype=float) for k, v in payload["samples"].items()}, True
        got = compute()
        payload = {"part": part, "n_layers": L, "n_samples": len(ids),
                   "samples": {k: _nulls(v) for k, v in got.items()}}
        store.save_or_warn(PART_KIND, pkey, payload, {"part": part, "model": lm.name}, notice)
        return got, False

    def gate():
        return cached_calibration(lm, prompts, _cal_config(cfg), use_cache, progress, notice)

    origin = PromptOrigin(prompts.name, used_fingerprint(prompts, _cal_config(cfg)))
    result = run_importance(lm, ids, cfg, progress, origin, gate, cached)
    store.save_or_warn(KIND, key, result.to_dict(), params, notice)
    return result, False


def _nulls(a: np.ndarray) -> list:
    """An array as nested lists, NaN as None (JSON has no NaN)."""
    return np.where(np.isnan(a), None, a).tolist()


def list_importance() -> list[dict]:
    return store.entries(KIND)


def load_importance(key: str, n_layers: int | None = None) -> ImportanceResult | None:
    payload = store.load(KIND, key, lambda p: check_result(p, ImportanceResult, n_layers))
    return None if payload is None else ImportanceResult.from_dict(payload)
