"""Quality estimates from per-item scores: every metric with n and a 95% interval, and for a
variant against the full model the paired difference (variant - full) with its interval.

Row fields for metric M: `M` (the mean), `M_ci` [low, high], and for variants other than the
full model `M_delta`, `M_delta_ci` (and `M_delta_p`, McNemar's exact p, for accuracies).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pop_analysis.engine.models import LoadedModel
from pop_analysis.quality import stats
from pop_analysis.quality.evalsets import gsm8k_fewshot_set
from pop_analysis.quality.evaluate import FULL, Arm, ItemScores, evaluate_variants
from pop_vllm.run_setting import RunSetting


@dataclass(frozen=True)
class Metric:
    """How one quality metric is estimated."""

    source: str  # the ItemScores field holding its per-item values
    binary: bool  # per-item 0/1 (exact intervals, McNemar) rather than a mean of numbers
    higher_is_better: bool
    paired: bool = True  # False where the values cover different items per variant
    bounds: tuple = (-math.inf, math.inf)  # the range a per-item value can take


UNIT, POSITIVE = (0.0, 1.0), (0.0, math.inf)
METRICS = {
    "continuation_nll": Metric("continuation_nll", False, False, bounds=POSITIVE),
    "next_token_kl": Metric("next_token_kl", False, False, bounds=POSITIVE),
    "next_token_top1": Metric("next_token_top1", False, True, bounds=UNIT),
    "teacher_forced_top1": Metric("teacher_forced_top1", False, True, bounds=UNIT),
    "greedy_agreement": Metric("greedy_agreement", False, True, bounds=UNIT),
    "sequence_exact": Metric("sequence_exact", True, True),
    "first_divergence": Metric("first_divergence", False, True, paired=False, bounds=POSITIVE),
    "exact_match": Metric("answer_correct", True, True),  # GSM8K number
    "retrieval_acc": Metric("answer_correct", True, True),  # retrieval code
}
ANSWER_METRICS = ("exact_match", "retrieval_acc")
HIGHER_IS_BETTER = {"acc": True}  # metrics computed elsewhere: multiple-choice accuracy (mc.py)


def too_few_note(n: int) -> str:
    return f"n = {n}: no 95% intervals (they need at least 2 items)"


def estimate(values, binary: bool, bounds=(-math.inf, math.inf)) -> stats.Estimate:
    return stats.proportion_ci(values) if binary else stats.mean_ci(values, bounds=bounds)


def delta(values, full_values, binary: bool) -> stats.Estimate:
    return (stats.paired_accuracy_delta if binary else stats.paired_delta)(values, full_values)


def metric_fields(scores: ItemScores, full: ItemScores | None = None,
                  answers: str | None = None) -> dict:
    """{M, M_ci, M_delta, M_delta_ci, ...} for each metric measured; `answers` names the answer
    metric (exact_match or retrieval_acc), None to leave answers out. Intervals are None when
    fewer than 2 items carry the metric (the point value stays)."""
    out: dict = {}
    for name, m in METRICS.items():
        if name in ANSWER_METRICS and name != answers:
            continue
        values = [v for v in getattr(scores, m.source) if v is not None]
        if not values:
            continue
        out[name] = sum(values) / len(values)
        out[f"{name}_ci"] = _ci(lambda: estimate(values, m.binary, m.bounds))
        if not m.paired:
            continue
        compare = full is not None and scores.arm.name != FULL.name
        d = _interval(lambda: delta(getattr(scores, m.source), getattr(full, m.source),
                                    m.binary)) if compare else None
        out[f"{name}_delta"] = _paired_mean(getattr(scores, m.source), getattr(full, m.source)) \
            if compare else None
        out[f"{name}_delta_ci"] = list(d.ci) if d else None
        if m.binary:
            out[f"{name}_delta_p"] = d.p_value if d else None
    return out


def _interval(make) -> stats.Estimate | None:
    try:
        return make()
    except stats.StatsError:
        return None


def _ci(make) -> list[float] | None:
    e = _interval(make)
    return list(e.ci) if e else None


def _paired_mean(values, full_values) -> float | None:
    pairs = [(a, b) for a, b in zip(values, full_values) if a is not None and b is not None]
    return sum(a - b for a, b in pairs) / len(pairs) if pairs else None


def gsm8k_exact_match(lm: LoadedModel, setting: RunSetting, n_samples: int = 8, n_shot: int = 0,
                      max_new_tokens: int = 256, source: str = "gsm8k", raw: bool = False) -> dict:
    """GSM8K accuracy with POP generation (batched), its 95% interval and, for a setting other
    than the full model, the paired difference from the full model on the same questions."""
    evalset = gsm8k_fewshot_set(lm, n_samples, n_shot, source, raw)
    v = Arm(str(setting.variant), setting) if setting.variant != "full" else FULL
    scores = evaluate_variants(lm, evalset.items, [v], max_new_tokens)
    fields = metric_fields(scores[v.name], scores["full"], "exact_match")
    return {"variant": str(setting.variant), "skip_layers": list(setting.skip),
            "n": len(evalset.items), "n_shot": n_shot, "note": evalset.note,
            "outputs": scores[v.name].outputs,
            **{k: fields.get(k) for k in ("exact_match", "exact_match_ci", "exact_match_delta",
                                          "exact_match_delta_ci", "exact_match_delta_p")}}


def delta_text(row: dict, metric: str, pct: bool = False, digits: int = 3) -> str | None:
    """'+0.153 [+0.136, +0.171] worse' for a row's paired difference from the full model (in
    points with `pct`); an interval that includes 0 reads 'no measurable change', never a win;
    McNemar's p follows for accuracies. None: the row has no difference for `metric`."""
    d, ci = row.get(f"{metric}_delta"), row.get(f"{metric}_delta_ci")
    if d is None:
        return None
    f = (lambda x: f"{100 * x:+.1f}") if pct else (lambda x: f"{x:+.{digits}f}")
    if not ci:
        return f"{f(d)} (no interval: fewer than 2 items)"
    e = stats.Estimate(row.get("n") or 0, d, tuple(ci), "")
    m = METRICS.get(metric)
    higher = m.higher_is_better if m else HIGHER_IS_BETTER.get(metric)
    word = stats.verdict(e, higher) if higher is not None else \
        stats.NO_CHANGE if e.includes(0) else ""
    text = f"{f(d)} [{f(ci[0])}, {f(ci[1])}] {word}".rstrip()
    p = row.get(f"{metric}_delta_p")
    return text + (f", p = {p:.2g}" if p is not None else "")


def comparison_rows(rows, metrics=None) -> list[dict]:
    """One dict per row: its label, n and `delta_text` of each metric any row carries (a dash
    where the row has none, e.g. the full model itself)."""
    metrics = [m for m in (metrics or METRICS)
               if any(r.get(f"{m}_delta") is not None for r in rows)]
    out = []
    for r in rows:
        label = r.get("variant", "")
        if r.get("kind") == "ratio":
            label = f"{label} {r.get('skip_ratio', 0):.2f}"
        elif r.get("kind") == "length":
            label = f"{label} @ {r.get('length')} tokens"
        out.append({"row": label, "n": r.get("n"), **{m: delta_text(r, m) or "—" for m in metrics}})
    return out
