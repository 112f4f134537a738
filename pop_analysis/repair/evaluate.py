"""Does a K/V repair help on prompts its fit never saw? Paired comparisons with the full model.

`compare` scores the full model, plain POP and each repair on the same items (evaluate.py's
batched pass: continuation NLL, teacher-forced KL(full || variant), answers). `gap_closed` is the
share of POP's NLL excess over the full model that a repair removes,

    share = mean(pop - repaired) / mean(pop - full)   (per-item NLLs, paired)

with a BCa bootstrap interval over items (scipy, seeded as stats.paired_delta is). 1 means the
repair reaches the full model, 0 means no help, below 0 means it hurts.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats as st

from pop_analysis.engine.models import LoadedModel
from pop_analysis.quality import stats
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.summary import metric_fields
from pop_analysis.repair.fit import Repair
from pop_analysis.repair.store import attach
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import Variant


def _ratio_of_means(a, b, axis=-1):
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def gap_closed(full, pop, repaired, confidence: float = stats.CONFIDENCE,
               seed: int = 0) -> stats.Estimate:
    """Share of the POP-vs-full gap in per-item values (e.g. NLL) that `repaired` closes, with a
    paired bootstrap interval; items missing any of the three values are dropped."""
    rows = [(f, p, r) for f, p, r in zip(full, pop, repaired)
            if None not in (f, p, r) and all(math.isfinite(x) for x in (f, p, r))]
    stats.check_n(len(rows))
    f, p, r = (np.asarray(c, dtype=float) for c in zip(*rows))
    gained, gap = p - r, p - f  # (n,) each
    if gap.mean() <= 0:
        raise stats.StatsError("POP shows no gap to the full model on these items: nothing to close")
    value = float(gained.mean() / gap.mean())
    for method in ("BCa", "percentile"):  # BCa fails on near-degenerate data: fall back
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = st.bootstrap((gained, gap), _ratio_of_means, paired=True, vectorized=True,
                               confidence_level=confidence, n_resamples=stats.RESAMPLES,
                               method=method, rng=np.random.default_rng(seed))
        lo, hi = res.confidence_interval
        if math.isfinite(lo) and math.isfinite(hi):
            return stats.Estimate(len(gap), value, (float(lo), float(hi)),
                                  f"bootstrap-{method.lower()}")
    raise stats.StatsError("the bootstrap gave no finite interval")  # pragma: no cover


def compare(lm: LoadedModel, items, skip, repairs: dict[str, Repair], max_new_tokens: int = 32,
            generate: bool = False) -> dict:
    """{name: ItemScores} for "full", "pop" and each repair (attached in turn for `skip`).

    The pop_repair variant reads the one repair registered for its skip set, so each further
    repair is scored in its own pass (the full model's pass is repeated there; same values)."""
    skip = tuple(skip)
    out: dict = {}
    for k, (name, rep) in enumerate(repairs.items()):
        attach(lm, rep, skip)
        variants = ([Arm("pop", RunSetting(skip))] if k == 0 else []) + [
            Arm(name, RunSetting(skip, Variant.POP_REPAIR))]
        scores = evaluate_variants(lm, items, variants, max_new_tokens, generate=generate)
        out.update(scores if k == 0 else {name: scores[name]})
    if not repairs:
        out.update(evaluate_variants(lm, items, [Arm("pop", RunSetting(skip))], max_new_tokens,
                                     generate=generate))
    return out


def summary(scores: dict, answers: str | None = None) -> dict:
    """Per variant: the quality fields with intervals (quality.metric_fields), and for each
    repair the share of POP's NLL and KL gaps it closes."""
    full, pop = scores["full"], scores["pop"]
    out = {name: metric_fields(s, full if name != "full" else None, answers)
           for name, s in scores.items()}
    for name, s in scores.items():
        if name in ("full", "pop"):
            continue
        for metric in ("continuation_nll", "next_token_kl"):  # the full model's own KL is 0
            est = _try(lambda: gap_closed(getattr(full, metric), getattr(pop, metric),
                                          getattr(s, metric)))
            note = no_gap(out["pop"], metric)
            if note:  # a share of a gap that may be zero is not a number to show
                est = None
            out[name][f"{metric}_gap_closed"] = est.value if est else None
            out[name][f"{metric}_gap_closed_ci"] = list(est.ci) if est else None
            out[name][f"{metric}_gap_closed_note"] = note
    return out


def no_gap(pop_fields: dict, metric: str) -> str | None:
    """Why no share of the gap is given: POP's own gap is not measurably above zero."""
    if metric == "next_token_kl":
        ci = pop_fields.get("next_token_kl_ci")
    else:
        ci = pop_fields.get(f"{metric}_delta_ci")
    if ci is None:
        return "too few items for an interval of POP's gap"
    if ci[0] <= 0:
        return "POP's gap to the full model is not measurable here (its 95% interval reaches 0)"
    return None


def _try(make):
    try:
        return make()
    except stats.StatsError:
        return None
