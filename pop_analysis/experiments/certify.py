"""The certified choice: a skip set with a finite-sample guarantee on items it never chose on.

Three disjoint splits (quality/splits.py): ranking prompts order the layers (an importance
run), the selection items drive the search, the certification items are touched once, after the
search has fixed its sequence.

1. Search (selection items only): a nested sequence S1 ⊂ S2 ⊂ ..., each the previous plus one
   layer. With refine = 1 (the default) each set adds the ranking's next layer (free sets: the
   next layer of the ranking's order; blocks: the block one layer longer at its lower-scored
   end), `chunk` sets per batched evaluation; with refine > 1 each step measures the next
   `refine` candidates together and keeps the one with the lowest bad-item rate (ties: lower
   mean ΔNLL), one evaluation per step. Either way the sequence ends with the first set whose
   selection rate exceeds α.
2. Certification (certification items): fixed-sequence testing, smallest set first, each at
   level δ with the exact binomial p-value of "the bad-item rate exceeds α"; the last set that
   passes is certified. Lazy: the sets are evaluated `chunk` at a time (the full model's pass
   shared within a chunk, the trunk below each set's lowest skipped layer reused), and nothing
   after the first failure is evaluated.

An item is bad when its paired ΔNLL exceeds ε ("nll"), or when POP's greedy continuation departs
from the full model's within `tokens` tokens ("divergence"). The guarantee: with probability at
least 1 - δ over the certification items, the certified set's bad-item rate on items drawn like
them is at most α. The mean ΔNLL is reported with its bootstrap interval as an estimate only.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_analysis.experiments.methods_compare import ranking_entry
from pop_analysis.experiments.methods_store import check_certificate
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES
from pop_analysis.progress import Tracker
from pop_analysis.quality import stats
from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.quality.guarantee import bad_items, check_level, fixed_sequence, risk_bound
from pop_analysis.quality.splits import Split
from pop_analysis.speed.flops import ideal_speedup
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record, plain
from pop_vllm.run_setting import RunSetting

KIND = "certificate"
LOSSES = ("nll", "divergence")
NOT_COVERED = ("The guarantee covers items drawn like the certification items ({data}, {answer} "
               "answer tokens scored) on this model; not other tasks, other prompt or answer "
               "lengths, other models or sampling settings.")


class CertifyError(InputError):
    """A certification that cannot run as asked."""


@dataclass(frozen=True)
class CertifyConfig:
    """The guarantee asked for and how the search and the test run; all part of the store key."""

    alpha: float = 0.1  # the largest bad-item rate certified
    epsilon: float = 0.1  # an item is bad when its paired ΔNLL exceeds this (nats per token)
    delta: float = 0.05  # the certificate fails with probability at most this
    loss: str = "nll"  # "nll" (ΔNLL > epsilon) or "divergence" (greedy departs within tokens)
    tokens: int = 16  # greedy tokens compared by the divergence loss
    method: str = "gate"  # whose ranking orders the layers (methods.py)
    shape: str = "free"  # "free" (any layers) or "block" (one contiguous block)
    refine: int = 1  # candidates per search step (1: the ranking's own order; more: greedy)
    answer_tokens: int = 32  # reference tokens scored per item (0: the whole reference)
    chunk: int = 4  # sets evaluated together on the certification items
    max_sets: int = 0  # the longest sequence (0: up to L - 1 layers)

    def __post_init__(self):
        for name in ("alpha", "delta"):
            try:
                check_level(name, getattr(self, name))
            except ValueError as e:
                raise CertifyError(str(e)) from None
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon)
                and self.epsilon >= 0):
            raise CertifyError(f"epsilon must be a finite number >= 0, got {self.epsilon!r}")
        if self.loss not in LOSSES:
            raise CertifyError(f"unknown loss {self.loss!r}; choose from {', '.join(LOSSES)}")
        if self.method not in METHODS:
            raise CertifyError(f"unknown method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.shape not in SHAPES:
            raise CertifyError(f"unknown shape {self.shape!r}; choose from {', '.join(SHAPES)}")
        if min(self.refine, self.chunk, self.tokens) < 1 or self.max_sets < 0 \
                or self.answer_tokens < 0:
            raise CertifyError("refine, chunk and tokens must be >= 1; max_sets and "
                               "answer_tokens >= 0")

    def bad_words(self) -> str:
        if self.loss == "nll":
            return f"lose more than {self.epsilon:g} nats per token"
        return f"see POP's greedy output depart from the full model's within {self.tokens} tokens"


@dataclass
class CertifyResult(Record):
    model: str
    n_layers: int
    method: str
    shape: str
    alpha: float
    epsilon: float
    delta: float
    loss: str
    met: bool  # a set was certified
    certified: list[int]  # the last set that passed ([] when none did)
    bound: float  # upper bound of the certified set's rate (or of the smallest set's)
    rate: float  # its observed bad-item rate on the certification items
    splits: list[dict]  # ranking, selection, certification: source, offset, n, fingerprint
    sequence: list[dict]  # the search's sets, in order, with selection and certification numbers
    ranking: list[float]  # the scores walked (larger = more important)
    importance: str  # what ranked the layers
    config: dict
    seconds: dict  # "selection", "certification"
    estimate: dict  # the certified set's mean ΔNLL on the certification items, BCa 95%
    ideal_speedup: float  # of the certified set at a 512-token prompt
    statement: str  # the certificate in plain words
    not_covered: str  # what the guarantee does not cover
    note: str  # one line on the outcome


def candidates(scores, current: tuple[int, ...], shape: str, refine: int) -> list[tuple[int, ...]]:
    """The next sets of the nested search: `current` plus one layer, most promising first."""
    L = len(scores)
    if shape == "free" or not current:
        order = [i for i in sorted(range(L), key=lambda i: (scores[i], -i)) if i not in current]
        return [tuple(sorted({*current, i})) for i in order[:refine]]
    a, b = current[0], current[-1]
    ends = sorted((i for i in (a - 1, b + 1) if 0 <= i < L), key=lambda i: (scores[i], -i))
    return [tuple(sorted({*current, i})) for i in ends][:refine]


def _items(lm: LoadedModel, split: Split, answer_tokens: int):
    evalset = load_eval_set(lm, split.source, split.offset + split.n)
    items = evalset.items[split.offset:split.offset + split.n]
    if answer_tokens:
        items = [dataclasses.replace(it, reference_ids=it.reference_ids[:answer_tokens])
                 for it in items]
    return list(items)


class _Measure:
    """Per-item losses of sets on one split, in batched evaluations."""

    def __init__(self, lm: LoadedModel, items, cfg: CertifyConfig, tracker: Tracker, phase: str):
        self.lm, self.items, self.cfg, self.tracker, self.phase = lm, items, cfg, tracker, phase

    def __call__(self, sets) -> dict[str, dict]:
        cfg, new = self.cfg, [Arm(describe(s), RunSetting(s)) for s in sets]
        step = lambda k: self.tracker.step(k, f"{self.phase}: {len(new)} set(s)")  # noqa: E731
        scores = evaluate_variants(self.lm, self.items, new, max(cfg.answer_tokens, 1)
                                   if cfg.loss == "nll" else cfg.tokens,
                                   generate=cfg.loss == "divergence", step=step)
        full = scores[FULL.name].continuation_nll
        out = {}
        for v in new:
            s = scores[v.name]
            delta = np.asarray(s.continuation_nll, float) - np.asarray(full, float)  # (n,)
            bad = (bad_items(delta, cfg.epsilon) if cfg.loss == "nll" else
                   np.asarray([d is not None for d in s.first_divergence], float))
            out[v.name] = {"bad": bad, "delta": delta, "nll": s.continuation_nll, "full": full}
        return out


def search(measure: _Measure, scores, cfg: CertifyConfig) -> list[dict]:
    """The nested sequence, built on the selection items only (see the module doc). With
    refine = 1 the sequence is the ranking's own (each set the previous plus its next layer),
    measured `chunk` sets per evaluation (the full model's pass shared) until one exceeds α."""
    longest = min(cfg.max_sets or len(scores) - 1, len(scores) - 1)
    seq, current = [], ()
    while len(current) < longest:
        cands = candidates(scores, current, cfg.shape, cfg.refine)
        steps = [cands]
        if cfg.refine == 1:  # the next steps are known: measure a chunk of them at once
            while len(steps) < cfg.chunk and len(current) + len(steps) < longest:
                steps.append(candidates(scores, steps[-1][0], cfg.shape, 1))
        got = measure([s for step in steps for s in step])
        for step in steps:
            best = min(step, key=lambda s: (got[describe(s)]["bad"].mean(),
                                            got[describe(s)]["delta"].mean()))
            g = got[describe(best)]
            seq.append({"set": describe(best), "skip_layers": list(best), "k": len(best),
                        "selection_rate": float(g["bad"].mean()),
                        "selection_delta": float(g["delta"].mean()), "tried": len(step)})
            current = best
            if g["bad"].mean() > cfg.alpha:
                return seq
    return seq


def test_sequence(measure: _Measure, seq: list[dict], cfg: CertifyConfig) -> tuple[int, dict]:
    """Fixed-sequence testing on the certification items, `chunk` sets per evaluation, lazily:
    (index of the certified set or -1, per-set measurements on those items)."""
    got: dict[str, dict] = {}

    def test(j: int):
        def run():
            if seq[j]["set"] not in got:
                chunk = [tuple(c["skip_layers"]) for c in seq[j:j + cfg.chunk]]
                got.update(measure(chunk))
            return risk_bound(got[seq[j]["set"]]["bad"], cfg.alpha, cfg.delta)
        return run

    last, bounds = fixed_sequence([test(j) for j in range(len(seq))], cfg.delta)
    for c, b in zip(seq, bounds):
        c.update(tested=True, passed=b.passes(cfg.delta), bad=int(b.bad), n=b.n, rate=b.rate,
                 upper=b.upper, p_value=b.p_value)
    return last, got


def certify(lm: LoadedModel, ranking, splits: list[Split], cfg: CertifyConfig = CertifyConfig(),
            progress=None, importance: str = "", items=None) -> CertifyResult:
    """Search on the selection split, certify on the certification split (module doc);
    `items`: the two splits' tokenised items when they are not read from their sources."""
    scores = [float(x) for x in ranking]
    if len(scores) != lm.adapter.n_layers:
        raise CertifyError(f"the ranking has {len(scores)} layers, the model {lm.adapter.n_layers}")
    _, sel, cer = splits
    sel_items, cer_items = items or (_items(lm, sel, cfg.answer_tokens),
                                     _items(lm, cer, cfg.answer_tokens))
    L = len(scores)
    tracker = Tracker(L * cfg.refine * len(sel_items) + L * len(cer_items), progress,
                      "certified choice")
    t0 = time.perf_counter()
    seq = search(_Measure(lm, sel_items, cfg, tracker, "search"), scores, cfg)
    t1 = time.perf_counter()
    last, got = test_sequence(_Measure(lm, cer_items, cfg, tracker, "certification"), seq, cfg)
    t2 = time.perf_counter()
    chosen = seq[last] if last >= 0 else seq[0]
    m = got[chosen["set"]]
    est = stats.paired_delta(m["nll"], m["full"])
    res = CertifyResult(
        model=lm.name, n_layers=L, method=cfg.method, shape=cfg.shape, alpha=cfg.alpha,
        epsilon=cfg.epsilon, delta=cfg.delta, loss=cfg.loss, met=last >= 0,
        certified=chosen["skip_layers"] if last >= 0 else [], bound=chosen["upper"],
        rate=chosen["rate"], splits=[s.record() for s in splits], sequence=seq, ranking=scores,
        importance=importance, config=plain(cfg),
        seconds={"selection": t1 - t0, "certification": t2 - t1},
        estimate={"set": chosen["set"], "delta_nll": est.value, "ci": list(est.ci), "n": est.n,
                  "kind": "estimate (BCa bootstrap 95%), not a guarantee"},
        ideal_speedup=ideal_speedup(lm.adapter.shape, 512, RunSetting(chosen["skip_layers"]))
        if last >= 0 else 1.0,
        statement="", not_covered=NOT_COVERED.format(data=cer.source, answer=cfg.answer_tokens),
        note="")
    res.statement, res.note = statement(res, cfg), outcome(res)
    return res


def statement(res: CertifyResult, cfg: CertifyConfig) -> str:
    """The certificate in plain words."""
    n = res.splits[2]["n"]
    if not res.met:
        return (f"nothing certified: even the smallest set tested, layers "
                f"{res.sequence[0]['set']}, has a bound of {res.bound:.3f} > α = {res.alpha:g}")
    return (f"certified: at most {res.alpha:.0%} of items {cfg.bad_words()}, with "
            f"{1 - res.delta:.0%} confidence, on {n} items it never chose on")


def outcome(res: CertifyResult) -> str:
    """One line: the certified set and its bound, or that nothing passed and the smallest
    set's bound."""
    tested = sum(1 for c in res.sequence if c.get("tested"))
    if not res.met:
        first = res.sequence[0]
        return (f"no set certified at α = {res.alpha:g}, δ = {res.delta:g}: the smallest set "
                f"(layers {first['set']}) has {first['bad']} bad of {first['n']} items, upper "
                f"bound {res.bound:.3f} > {res.alpha:g}")
    return (f"certified {len(res.certified)} of {res.n_layers} layers ({describe(res.certified)}): "
            f"bad-item rate {res.rate:.3f}, upper bound {res.bound:.3f} <= α = {res.alpha:g} at "
            f"δ = {res.delta:g} ({tested} of {len(res.sequence)} sets tested); ideal prefill "
            f"speedup {res.ideal_speedup:.2f}x")


def cached_certify(lm: LoadedModel, importance, splits: list[Split],
                   cfg: CertifyConfig = CertifyConfig(), use_cache=True, progress=None,
                   notice=None) -> tuple[CertifyResult, bool]:
    """(result, was_hit) for a ranking from an importance run (methods_run.ImportanceResult)."""
    ranking, params, label = ranking_entry(lm, importance, cfg.method, CertifyError)
    params |= {"splits": [s.record() for s in splits], "config": dataclasses.asdict(cfg)}
    payload, hit = store.cached(
        KIND, params, lambda: certify(lm, ranking, splits, cfg, progress, label).to_dict(),
        use_cache, lambda p: check_certificate(p, CertifyResult, lm.adapter.n_layers), notice)
    return CertifyResult.from_dict(payload), hit
