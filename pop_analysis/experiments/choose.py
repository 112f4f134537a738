"""The budgeted choice: the largest skip set whose POP quality stays inside a budget.

A budget bounds the 95% interval, not the mean: ΔNLL against the full model (paired over items)
must have its upper bound <= max_delta_nll, the top-1 agreement with the full model its lower
bound >= min_top1. The search walks one method's ranking. Bisection over k: each round measures
`probes` set sizes spread over the range still open (one batched evaluation, the full model's
pass shared; probes = 1 is plain bisection), keeps the largest that meets the budget as the lower
end and the smallest failing one above it as the upper end, assuming that quality worsens with k.
Then a greedy refinement grows the best set one layer at a time, trying the next `refine`
candidates of the ranking together (free sets: one more layer; blocks: the lowest-scored blocks
one layer longer) while one of them meets the budget. Every candidate is measured on held-out
items and listed. Bounded by max_candidates; cancellable; progress with an ETA.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_analysis.experiments.methods_compare import eval_items, ranking_entry, set_quality
from pop_analysis.experiments.methods_store import check_choice
from pop_analysis.experiments.sweep_speed import speed_fields
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES, pick
from pop_analysis.importance.suggest import lowest_block
from pop_analysis.progress import Tracker, keeping
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.speed.flops import ideal_speedup
from pop_analysis.speed.timing import TimingConfig
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record, plain
from pop_vllm.run_setting import RunSetting

KIND = "choice"


class ChooseError(InputError):
    """A budget or search that cannot run as asked."""


@dataclass(frozen=True)
class Budget:
    """Quality the chosen set must keep, judged on the 95% interval's bound."""

    max_delta_nll: float | None = None  # upper bound of ΔNLL vs the full model, nats per token
    min_top1: float | None = None  # lower bound of the top-1 agreement with the full model

    def __post_init__(self):
        if self.max_delta_nll is None and self.min_top1 is None:
            raise ChooseError("give a budget: a largest ΔNLL, a smallest top-1 agreement or both")
        if self.max_delta_nll is not None and not (math.isfinite(self.max_delta_nll)
                                                   and self.max_delta_nll >= 0):
            raise ChooseError(f"the ΔNLL budget must be a finite number >= 0, got {self.max_delta_nll}")
        if self.min_top1 is not None and not 0 < self.min_top1 <= 1:
            raise ChooseError(f"the top-1 budget must lie in (0, 1], got {self.min_top1}")

    def describe(self) -> str:
        parts = []
        if self.max_delta_nll is not None:
            parts.append(f"ΔNLL upper bound <= {self.max_delta_nll:g}")
        if self.min_top1 is not None:
            parts.append(f"top-1 agreement lower bound >= {self.min_top1:.0%}")
        return " and ".join(parts)


@dataclass(frozen=True)
class ChooseConfig:
    """How the search measures; every field is part of its store key."""

    method: str = "gate"  # whose ranking is walked (methods.py)
    shape: str = "free"  # "free" (any layers) or "block" (one contiguous block)
    dataset: str = "gsm8k"  # held-out items (not the ranking's prompts)
    n_samples: int = 64  # items per candidate
    offset: int = 0  # items skipped first (when the set is the ranking's own)
    answer_tokens: int = 32  # reference tokens scored per item (0: the whole reference)
    probes: int = 3  # set sizes measured per bisection round
    refine: int = 4  # candidates measured per refinement round
    max_candidates: int = 24  # the most sets measured in all
    speed: bool = True  # time the chosen set (the timing protocol)
    bench_tokens: int = 512  # prompt length of the speedups
    repeats: int = 3  # fewest timed rounds
    timing_budget_s: float = 2.0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ChooseError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.shape not in SHAPES:
            raise ChooseError(f"unknown shape {self.shape!r}; choose from {', '.join(SHAPES)}")
        if min(self.probes, self.refine, self.max_candidates) < 1 or self.n_samples < 2:
            raise ChooseError("probes, refine and max_candidates must be >= 1, n_samples >= 2")


@dataclass
class ChoiceResult(Record):
    model: str
    n_layers: int
    method: str
    shape: str
    budget: dict  # Budget as a dict
    met: bool  # False: no non-empty set met the budget
    chosen: list[int]  # the largest set that met it ([] when none did)
    candidates: list[dict]  # every set measured, in order, with its quality and verdict
    ranking: list[float]  # the scores walked (larger = more important)
    data: str  # the held-out items
    n: int
    config: dict
    seconds: float
    ideal_speedup: float = 1.0  # of the chosen set at bench_tokens
    speed: dict = field(default_factory=dict)  # the chosen set's measured speedup fields
    best_found: dict | None = None  # when none met: the candidate that missed by the least
    importance: str = ""  # what ranked the layers
    note: str = ""  # one line on the outcome


class _Search:
    """The measured candidates and the batched evaluation of new ones."""

    def __init__(self, lm: LoadedModel, items, budget: Budget, cfg: ChooseConfig, tracker: Tracker):
        self.lm, self.items, self.budget, self.cfg, self.tracker = lm, items, budget, cfg, tracker
        self.tried: dict[str, dict] = {}

    def measure(self, sets: list[tuple[int, ...]], phase: str) -> list[dict]:
        new = [s for s in dict.fromkeys(sets) if describe(s) not in self.tried]
        new = new[:self.cfg.max_candidates - len(self.tried)]
        if new:
            variants = [Arm(describe(s), RunSetting(s)) for s in new]
            step = lambda k: self.tracker.step(k, f"{phase}: {len(new)} set(s)", kind="evaluation")  # noqa: E731
            scores = evaluate_variants(self.lm, self.items, variants, max(self.cfg.answer_tokens, 1),
                                       generate=False, step=step)
            for s in new:
                self.tried[describe(s)] = self._candidate(s, scores, phase)
        return [self.tried[describe(s)] for s in sets if describe(s) in self.tried]

    def _candidate(self, skip, scores, phase: str) -> dict:
        c = {"k": len(skip), "skip_layers": list(skip), "set": describe(skip), "phase": phase,
             **set_quality(scores[describe(skip)], scores[FULL.name])}
        miss = shortfall(c, self.budget)
        c["shortfall"], c["meets"] = (miss if math.isfinite(miss) else None), miss <= 0
        return c

    @property
    def full(self) -> bool:
        return len(self.tried) >= self.cfg.max_candidates


def shortfall(c: dict, budget: Budget) -> float:
    """By how much a candidate misses the budget, in the units of its worst constraint (<= 0:
    it meets it); an interval that could not be computed misses it."""
    misses = []
    if budget.max_delta_nll is not None:
        ci = c.get("continuation_nll_delta_ci")
        misses.append(ci[1] - budget.max_delta_nll if ci else math.inf)
    if budget.min_top1 is not None:
        ci = c.get("next_token_top1_ci")
        misses.append(budget.min_top1 - ci[0] if ci else math.inf)
    return max(misses)


def ranked_set(scores, k: int, shape: str) -> tuple[int, ...]:
    return () if k == 0 else pick(scores, k, shape)


def bisect(search: _Search, scores, shape: str) -> int:
    """The largest k (0..L-1) whose ranked set met the budget, probing `probes` sizes a round."""
    lo, hi, p = 0, len(scores) - 1, search.cfg.probes
    while hi > lo and not search.full:
        ks = sorted({lo + math.ceil((hi - lo) * j / (p + 1)) for j in range(1, p + 1)}) \
            if hi - lo > p else list(range(lo + 1, hi + 1))
        got = search.measure([ranked_set(scores, k, shape) for k in ks], "bisection")
        if not got:
            break
        met = [c["k"] for c in got if c["meets"]]
        new_lo = max(met, default=lo)
        failing = [c["k"] for c in got if not c["meets"] and c["k"] > new_lo]
        lo, hi = new_lo, min(failing) - 1 if failing else hi
    return lo


def grow(search: _Search, scores, best: tuple[int, ...], shape: str) -> tuple[int, ...]:
    """Greedy refinement: one layer more while a candidate of the next round meets the budget."""
    L = len(scores)
    while len(best) < L - 1 and not search.full:
        cands = [s for s in _next_sets(scores, best, shape)
                 if describe(s) not in search.tried][:search.cfg.refine]
        got = [c for c in search.measure(cands, "refinement") if c["meets"]]
        if not got:
            break
        best = tuple(min(got, key=lambda c: c["continuation_nll_delta"] or 0.0)["skip_layers"])
    return best


def _next_sets(scores, best, shape: str) -> list[tuple[int, ...]]:
    """Sets one layer larger than `best`, most promising first by the ranking."""
    L, k = len(scores), len(best) + 1
    if shape == "free":
        order = sorted(range(L), key=lambda i: (scores[i], -i))
        return [tuple(sorted({*best, c})) for c in order if c not in best]
    starts = sorted(range(L - k + 1), key=lambda s: (sum(scores[s:s + k]), -s))
    blocks = [tuple(range(s, s + k)) for s in starts]
    return [b for b in blocks if b != tuple(lowest_block(scores, k))] or blocks


def choose(lm: LoadedModel, ranking, budget: Budget, cfg: ChooseConfig = ChooseConfig(),
           progress=None, importance: str = "", evalset=None) -> ChoiceResult:
    """The largest set of `ranking`'s order (scores per layer, larger = more important) that
    meets `budget` on held-out items (cfg.dataset, or the EvalSet given; see the module doc)."""
    t0 = time.perf_counter()
    scores = [float(x) for x in ranking]
    if len(scores) != lm.adapter.n_layers:
        raise ChooseError(f"the ranking has {len(scores)} layers, the model {lm.adapter.n_layers}")
    evalset, items = eval_items(lm, cfg, evalset)
    tracker = Tracker(cfg.max_candidates * len(items), progress, "budgeted choice",
                      plan={"evaluation": cfg.max_candidates * len(items)})
    search = _Search(lm, items, budget, cfg, tracker)
    head = dict(model=lm.name, n_layers=len(scores), method=cfg.method, shape=cfg.shape,
                budget=dataclasses.asdict(budget), ranking=scores, n=len(items),
                data=f"{evalset.name}:{evalset.fingerprint[:12]}", config=plain(cfg),
                importance=importance)
    with keeping(lambda: _result(lm, search, head, (), t0, cfg, timed=False)):
        k = bisect(search, scores, cfg.shape)
        best = grow(search, scores, ranked_set(scores, k, cfg.shape), cfg.shape) if k else ()
    return _result(lm, search, head, best, t0, cfg, timed=cfg.speed)


def _result(lm: LoadedModel, search: _Search, head: dict, best, t0: float, cfg: ChooseConfig,
            timed: bool) -> ChoiceResult:
    cands = list(search.tried.values())
    met_sets = [c for c in cands if c["meets"]]
    if not best and met_sets:  # a cancelled search keeps the largest set that met so far
        best = tuple(max(met_sets, key=lambda c: (c["k"], -(c["continuation_nll_delta"] or 0)))
                     ["skip_layers"])
    out = ChoiceResult(**head, met=bool(best), chosen=list(best), candidates=cands,
                       seconds=time.perf_counter() - t0,
                       ideal_speedup=ideal_speedup(lm.adapter.shape, cfg.bench_tokens,
                                                   RunSetting(best)))
    if not best and cands:
        out.best_found = min(cands, key=lambda c: math.inf if c["shortfall"] is None
                             else c["shortfall"])
    if best and timed:
        out.speed = speed_fields(lm, RunSetting(best), cfg.bench_tokens,
                                 TimingConfig(min_rounds=cfg.repeats, budget_s=cfg.timing_budget_s))
    out.note = outcome_line(out, Budget(**out.budget))
    return out


def outcome_line(res: ChoiceResult, budget: Budget) -> str:
    """One line: what was chosen, or that nothing met the budget and the best found."""
    if res.met:
        c = next(c for c in res.candidates if c["skip_layers"] == res.chosen)
        return (f"{len(res.chosen)} of {res.n_layers} layers ({describe(res.chosen)}) meet "
                f"{budget.describe()}: ΔNLL {_ci(c, 'continuation_nll_delta')}, top-1 "
                f"{_ci(c, 'next_token_top1')}; ideal prefill speedup {res.ideal_speedup:.2f}x at "
                f"{res.config.get('bench_tokens', 512)} tokens{measured_text(res.speed)} "
                f"({len(res.candidates)} sets tried)")
    line = f"no skip set meets {budget.describe()} ({len(res.candidates)} sets tried)"
    b = res.best_found
    if b:
        line += (f"; the best found: layers {b['set']}, ΔNLL {_ci(b, 'continuation_nll_delta')}, "
                 f"top-1 {_ci(b, 'next_token_top1')}")
    return line


def measured_text(speed: dict) -> str:
    """', measured 1.27x (IQR 1.22-1.31, 5 rounds)', flagged with the protocol's reason."""
    v = speed.get("prefill_speedup")
    if not v:
        return ""
    rng, rounds = speed.get("speedup_range") or [v, v], speed.get("timing_rounds")
    text = f", measured {v:.2f}x (IQR {rng[0]:.2f}-{rng[1]:.2f}, {rounds} rounds)"
    if speed.get("timing_trustworthy") is not True:
        text += f" ⚠ flagged: {speed.get('timing_note') or 'not judged by the protocol'}"
    return text


def _ci(c: dict, key: str) -> str:
    v, ci = c.get(key), c.get(f"{key}_ci")
    if v is None:
        return "—"
    return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{v:.3f}"


def cached_choice(lm: LoadedModel, importance, budget: Budget, cfg: ChooseConfig = ChooseConfig(),
                  use_cache=True, progress=None, notice=None) -> tuple[ChoiceResult, bool]:
    """(result, was_hit) for a ranking from an importance run (methods_run.ImportanceResult)."""
    ranking, params, label = ranking_entry(lm, importance, cfg.method, ChooseError)
    params |= {"budget": dataclasses.asdict(budget), "config": dataclasses.asdict(cfg)}
    payload, hit = store.cached(
        KIND, params, lambda: choose(lm, ranking, budget, cfg, progress, label).to_dict(),
        use_cache, lambda p: check_choice(p, ChoiceResult, lm.adapter.n_layers), notice)
    return ChoiceResult.from_dict(payload), hit
