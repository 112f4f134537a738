"""Which method picks the best prefill skip set: POP's quality with each method's set, per budget.

For every method of an importance run, every budget k (a share of the layers) and both shapes
(one contiguous block, a free set), the method's set is run by POP on held-out items (every
distinct set in one batched evaluation, the full model's pass shared): ΔNLL, KL and top-1
agreement against the full model, paired over items with 95% intervals (quality/summary.py),
retrieval when asked for, the FLOP ideal and the measured prefill speedup (the timing protocol).
The random baseline runs several seeds (its spread). One verdict per distinct k and shape: the set
with the lowest ΔNLL, and whether a paired interval over the same items separates it from the
tail baseline's set; ties (the identical set) are named as ties and budgets that give the same k
are one cell (methods_verdicts.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_analysis.experiments import methods_verdicts as mv
from pop_analysis.experiments.methods_store import check_comparison
from pop_analysis.experiments.sweep_quality import row_quality
from pop_analysis.experiments.sweep_speed import speed_fields
from pop_analysis.importance.methods import primary
from pop_analysis.importance.picks import BUDGETS, SHAPES, budget_k, jaccard, pick, random_pick
from pop_analysis.progress import Tracker
from pop_analysis.quality import stats
from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.speed.flops import ideal_speedup
from pop_analysis.speed.timing import TimingConfig
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record, plain
from pop_vllm.run_setting import RunSetting

KIND = "method_compare"


class CompareError(InputError):
    """A comparison that cannot run as asked."""


@dataclass(frozen=True)
class CompareConfig:
    """What the comparison measures; every field is part of its store key."""

    budgets: tuple[float, ...] = BUDGETS  # shares of the layers skipped
    shapes: tuple[str, ...] = SHAPES  # "block" and / or "free"
    dataset: str = "gsm8k"  # held-out items: questions with reference answers (not the ranking's prompts)
    n_samples: int = 100  # items
    offset: int = 0  # items of the set skipped first (when it is the ranking's own set)
    answer_tokens: int = 32  # reference tokens scored per item (0: the whole reference)
    random_seeds: int = 3  # draws of the random baseline per budget and shape
    speed: bool = True  # time each method's set (the timing protocol; random draws are not timed)
    bench_tokens: int = 512  # prompt length of the timed speedup and of the FLOP ideal
    repeats: int = 3  # fewest timed rounds per set
    timing_budget_s: float = 1.0  # more rounds while they fit in this many seconds
    retrieval_n: int = 0  # synthetic retrieval items scored too (greedy exact match); 0 = none
    retrieval_length: int = 512  # their prompt tokens

    def __post_init__(self):
        if any(not 0 < b < 1 for b in self.budgets):
            raise CompareError(f"skip budgets are shares of the layers in (0, 1), got {self.budgets}")
        if not self.budgets or not self.shapes or set(self.shapes) - set(SHAPES):
            raise CompareError(f"give budgets and shapes among {', '.join(SHAPES)}")
        if self.n_samples < 2 or self.offset < 0 or self.answer_tokens < 0 or self.random_seeds < 0:
            raise CompareError("the comparison needs n_samples >= 2 (paired intervals), offset, "
                               "answer_tokens and random_seeds >= 0")


@dataclass
class ComparisonResult(Record):
    model: str
    n_layers: int
    importance: str  # what ranked the layers: "<dataset>, n = <n>" of the importance run
    data: str  # the held-out items: "<name>:<fingerprint>"
    n: int  # items
    rows: list[dict]  # one per (method, budget, shape) and per random draw
    verdicts: list[dict]  # one per (budget, shape)
    config: dict
    seconds: float
    item_nll: dict = field(default_factory=dict)  # set label -> per-item NLL; "full" too
    notes: list = field(default_factory=list)


def plan_sets(importance, cfg: CompareConfig) -> list[dict]:
    """Every (method, budget, shape[, seed]) and the set it picks; nothing run."""
    L = importance.n_layers
    dropone = importance.series.get("dropone.nll")
    out = []
    for budget in cfg.budgets:
        k = budget_k(L, budget)
        for shape in cfg.shapes:
            truth = pick(dropone, k, shape) if dropone else None
            for m in importance.methods:
                if m == "random":
                    continue
                skip = pick(importance.series[primary(m)], k, shape)
                out.append(dict(method=m, budget=budget, shape=shape, k=k, skip=skip,
                                jaccard_dropone=jaccard(skip, truth) if truth else None))
            if "random" in importance.methods:
                for seed in range(cfg.random_seeds):
                    skip = random_pick(L, k, shape, 1000 * seed + k)
                    out.append(dict(method="random", seed=seed, budget=budget, shape=shape, k=k,
                                    skip=skip, jaccard_dropone=jaccard(skip, truth) if truth else None))
    return out


def eval_items(lm: LoadedModel, cfg, evalset=None):
    """The held-out items (cfg.dataset, or the EvalSet given) after cfg.offset, at most
    cfg.n_samples, references cut to cfg.answer_tokens."""
    evalset = evalset or load_eval_set(lm, cfg.dataset, cfg.offset + cfg.n_samples)
    items = evalset.items[cfg.offset:cfg.offset + cfg.n_samples]
    if len(items) < 2:
        raise CompareError(f"{cfg.dataset} holds {len(evalset.items)} items; after skipping "
                           f"{cfg.offset} fewer than 2 remain")
    if cfg.answer_tokens:
        items = [dataclasses.replace(it, reference_ids=it.reference_ids[:cfg.answer_tokens])
                 for it in items]
    return evalset, items


def compare_methods(lm: LoadedModel, importance, cfg: CompareConfig = CompareConfig(),
                    progress=None, evalset=None) -> ComparisonResult:
    """Quality and speed of every method's set for every budget and shape (see the module doc)."""
    t0 = time.perf_counter()
    if importance.n_layers != lm.adapter.n_layers:
        raise CompareError(f"the importance run is for {importance.n_layers} layers, the model "
                           f"has {lm.adapter.n_layers}")
    planned = plan_sets(importance, cfg)
    evalset, items = eval_items(lm, cfg, evalset)
    sets = {describe(p["skip"]): p["skip"] for p in planned}
    timed = {describe(p["skip"]) for p in planned if p["method"] != "random"} if cfg.speed else set()
    tracker = Tracker(len(items) * len(sets) + len(timed), progress, "comparing methods",
                      plan={"evaluation": len(items) * len(sets), "timing": len(timed)})
    variants = [Arm(label, RunSetting(skip)) for label, skip in sets.items()]
    step = lambda k: tracker.step(k, "evaluating the sets", kind="evaluation")  # noqa: E731
    scores = evaluate_variants(lm, items, variants, max(cfg.answer_tokens, 1), generate=False,
                               step=step)
    retrieval = _retrieval(lm, cfg, variants)
    speeds = {label: _speed(lm, sets[label], cfg, tracker) for label in sets if label in timed}
    quality = {label: set_quality(scores[label], scores[FULL.name]) for label in sets}
    if retrieval is not None:
        n_ret = len(retrieval[FULL.name].answer_correct)
        for label, q in quality.items():
            r = row_quality(retrieval, label, n_ret, "retrieval_acc")
            q.update({k: v for k, v in r.items() if k.startswith("retrieval_acc")})
    rows = [_row(lm, p, quality, speeds, len(items), cfg) for p in planned]
    return ComparisonResult(
        model=lm.name, n_layers=lm.adapter.n_layers,
        importance=f"{importance.dataset}, n = {importance.n_samples}",
        data=f"{evalset.name}:{evalset.fingerprint[:12]}", n=len(items), rows=rows,
        verdicts=verdicts(rows, scores), config=plain(cfg),
        seconds=time.perf_counter() - t0,
        item_nll={k: s.continuation_nll for k, s in scores.items()},
        notes=[evalset.note] if evalset.note else [])


def set_quality(s, full) -> dict:
    """A set's quality with 95% intervals: ΔNLL paired against the full model over the items
    (BCa bootstrap), the top-1 agreement with it and KL(full ‖ set) (Student's t)."""
    d = stats.paired_delta(s.continuation_nll, full.continuation_nll)
    top1 = stats.mean_ci(s.next_token_top1, bounds=(0.0, 1.0))
    kl = stats.mean_ci(s.next_token_kl, bounds=(0.0, math.inf))
    return {"continuation_nll_delta": d.value, "continuation_nll_delta_ci": list(d.ci),
            "next_token_top1": top1.value, "next_token_top1_ci": list(top1.ci),
            "next_token_kl": kl.value, "next_token_kl_ci": list(kl.ci)}


def _retrieval(lm: LoadedModel, cfg: CompareConfig, variants) -> dict | None:
    if not cfg.retrieval_n:
        return None
    ret = load_eval_set(lm, f"retrieval:{cfg.retrieval_length}", cfg.retrieval_n)
    return evaluate_variants(lm, ret.items, variants, 8, generate=True)


def _speed(lm: LoadedModel, skip, cfg: CompareConfig, tracker: Tracker) -> dict:
    timing = TimingConfig(min_rounds=cfg.repeats, budget_s=cfg.timing_budget_s)
    out = speed_fields(lm, RunSetting(skip), cfg.bench_tokens, timing,
                       lambda: tracker.step(0, f"timing layers {describe(skip)}"))
    tracker.step(1, f"timed layers {describe(skip)}", kind="timing")
    return out


def _row(lm: LoadedModel, p: dict, quality: dict, speeds, n: int, cfg: CompareConfig) -> dict:
    label = describe(p["skip"])
    row = {"method": p["method"], "budget": p["budget"], "shape": p["shape"], "k": p["k"],
           "skip_layers": list(p["skip"]), "set": label, "n": n,
           "jaccard_dropone": p["jaccard_dropone"],
           "ideal_speedup": ideal_speedup(lm.adapter.shape, cfg.bench_tokens,
                                          RunSetting(p["skip"])),
           **quality[label]}
    if "seed" in p:
        row["seed"] = p["seed"]
    row.update(speeds.get(label, {}))
    return row


def paired_from(item_nll: dict):
    """paired(a, b) over per-item NLL: (mean of a - b, 95% BCa interval); None for one set."""
    def paired(a: str, b: str):
        if a == b or a not in item_nll or b not in item_nll:
            return None
        d = stats.paired_delta(item_nll[a], item_nll[b])
        return d.value, d.ci
    return paired


def verdicts(rows: list[dict], scores) -> list[dict]:
    """Per distinct k and shape: the best set(s) by ΔNLL and how they stand against the tail's
    set (methods_verdicts.py: ties named as ties, budgets of one k merged)."""
    return mv.verdicts(rows, paired_from({k: s.continuation_nll for k, s in scores.items()}))


def importance_params(importance) -> dict:
    """What identifies the ranking a comparison or a choice walked (its store key's part)."""
    return {"dataset": importance.dataset, "fingerprint": importance.fingerprint,
            "n_samples": importance.n_samples, "config": importance.config,
            "series": {m: importance.series[primary(m)] for m in importance.methods}}


def ranking_entry(lm: LoadedModel, importance, method: str,
                  error: type[Exception]) -> tuple[list, dict, str]:
    """What a choice on an importance run's ranking (choose, certify) stores under: (the ranking,
    the store params naming model, card and ranking, the run's label). `error` when the run has
    no scores for `method`."""
    if method not in importance.methods:
        raise error(f"the importance run has no {method!r} scores "
                    f"(it ran {', '.join(importance.methods)})")
    params = {"model": lm.name, "card": lm.card(), "importance": importance_params(importance)}
    return (importance.series[primary(method)], params,
            f"{importance.dataset}, n = {importance.n_samples}")


def cached_comparison(lm: LoadedModel, importance, cfg: CompareConfig = CompareConfig(),
                      use_cache=True, progress=None, notice=None, compute_missing=True):
    """(result, was_hit): the stored comparison for this model, ranking and config, or computed
    and stored; with compute_missing=False a miss gives (None, False)."""
    params = {"model": lm.name, "card": lm.card(), "importance": importance_params(importance),
              "config": dataclasses.asdict(cfg)}
    check = lambda p: check_comparison(p, ComparisonResult, lm.adapter.n_layers)  # noqa: E731
    if not compute_missing:
        hit = store.load(KIND, store.make_key(params), check, notice)
        return (ComparisonResult.from_dict(hit), True) if hit is not None else (None, False)
    payload, hit = store.cached(KIND, params, lambda: compare_methods(lm, importance, cfg,
                                                                      progress).to_dict(),
                                use_cache, check, notice)
    return ComparisonResult.from_dict(payload), hit
