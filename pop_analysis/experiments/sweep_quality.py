"""The quality half of a sweep row: all of a sweep's variants evaluated in one batched pass
(evaluate.py), turned into row fields with n, 95% intervals and paired differences from the
full model (quality.py)."""
from __future__ import annotations

from pop_analysis.engine.models import LoadedModel
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.quality.items import EvalSet
from pop_analysis.quality.summary import metric_fields
from pop_vllm.run_setting import RunSetting


def row_quality(scores, key: str, n: int, answers: str | None) -> dict:
    """Row fields of one variant from `evaluate_variants` output (key: its name there), with the
    full model's own continuation NLL and answer accuracy on the same items beside them."""
    if not scores:
        return {}
    out = {"n": n, **metric_fields(scores[key], scores[FULL.name], answers)}
    full = metric_fields(scores[FULL.name], None, answers)
    for m in ("continuation_nll", answers):
        if m in full:
            out[f"full_{m}"], out[f"full_{m}_ci"] = full[m], full[f"{m}_ci"]
    return out


def answers_metric(evalset: EvalSet, task_accuracy: bool) -> str | None:
    if evalset.kind == "retrieval":
        return "retrieval_acc"
    return "exact_match" if evalset.kind == "gsm8k" and task_accuracy else None


def run_key(setting: RunSetting) -> str:
    """A setting's name among a sweep's evaluated arms ("pop:20,21"; the full model: "full")."""
    if not setting.active:
        return FULL.name
    return f"{setting.variant}:{','.join(map(str, setting.skip))}"


def evaluate_runs(lm: LoadedModel, items, runs, new_tokens, tracker, kind,
                  greedy: bool = True) -> dict | None:
    """Every RunSetting of `runs` over `items` in one batched pass; None without items."""
    if not items:
        return None
    variants = {run_key(s): Arm(run_key(s), s) for s in runs}
    step = lambda k: tracker.step(k, message=f"{kind}: evaluating")  # noqa: E731
    return evaluate_variants(lm, items, list(variants.values()), new_tokens, greedy, step=step)
