"""Multiple choice by log-likelihood through lm-evaluation-harness, on local task files over the
shared data (offline): each variant against the full model on the same documents, with exact
intervals and McNemar's paired test (stats.py).

Task templates live in pop_analysis/harness/lm_eval_tasks/; `task_dir()` renders them for the data folder
(evalsets.data_dir()) so that `--include_path` can point at them.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from pop_analysis.engine.models import LoadedModel
from pop_analysis.quality.evalsets import data_dir
from pop_analysis.quality.evaluate import FULL, Arm
from pop_analysis.quality.items import EvalDataError
from pop_analysis.quality.summary import delta, estimate
from pop_analysis.store.paths import cache_dir

TEMPLATES = Path(__file__).resolve().parent / "lm_eval_tasks"
LOCAL_TASKS = ("pop_gsm8k_final", "pop_gsm8k_solution")
NEEDS = "gsm8k_test.jsonl"  # the data file the templates read


def task_dir(data: Path | None = None) -> Path:
    """The local task YAMLs rendered for the data folder (default: the shared data)."""
    data = Path(data or data_dir()).resolve()
    if not (data / NEEDS).is_file():
        raise EvalDataError(f"local lm-eval tasks need {data / NEEDS}: not found")
    out = cache_dir() / "lm_eval_tasks" / hashlib.sha256(str(data).encode()).hexdigest()[:12]
    out.mkdir(parents=True, exist_ok=True)
    for tmpl in TEMPLATES.glob("*.yaml.tmpl"):
        text = tmpl.read_text(encoding="utf-8").replace("@DATA_DIR@", data.as_posix())
        (out / tmpl.name.removesuffix(".tmpl")).write_text(text, encoding="utf-8")
    shutil.copyfile(TEMPLATES / "utils.py", out / "utils.py")
    return out


def per_doc(lm: LoadedModel, arm: Arm, tasks, limit: int | None,
            metric: str = "acc_norm") -> dict[str, dict[int, float]]:
    """{task: {doc_id: 1.0 / 0.0}} of one arm, run through lm-eval's own task pipeline."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from pop_analysis.harness.lm_eval_model import PopLM

    s = arm.setting  # lm-eval builds its model from model_args: the setting goes as its flags
    skip = {"skip": ";".join(map(str, s.skip))} if s.skip else {"preset": "none"}
    model = PopLM(lm=lm, variant=str(s.variant), **skip)
    manager = TaskManager(include_path=str(task_dir()), include_defaults=False)
    out = simple_evaluate(model=model, tasks=list(tasks), limit=limit, task_manager=manager,
                          log_samples=True)
    return {t: {int(s["doc_id"]): float(s[metric]) for s in out["samples"][t]} for t in tasks}


def mc_compare(lm: LoadedModel, variants, tasks=LOCAL_TASKS, limit: int | None = 100,
               metric: str = "acc_norm") -> list[dict]:
    """One row per task and variant (the full model first): n, accuracy with its exact 95%
    interval and, for variants, the paired difference from the full model with McNemar's p."""
    runs = [FULL] + [v for v in variants if v.name != FULL.name]
    hits = {v.name: per_doc(lm, v, tasks, limit, metric) for v in runs}
    rows = []
    for task in tasks:
        docs = sorted(hits[FULL.name][task])
        full = [hits[FULL.name][task][d] for d in docs]
        for v in runs:
            mine = [hits[v.name][task][d] for d in docs]
            acc = estimate(mine, binary=True)
            row = {"task": task, "metric": metric, "variant": v.name,
                   "skip_layers": list(v.setting.skip), "n": acc.n, "acc": acc.value, "acc_ci": list(acc.ci)}
            if v.name != FULL.name:
                d = delta(mine, full, binary=True)
                row.update(acc_delta=d.value, acc_delta_ci=list(d.ci), acc_delta_p=d.p_value)
            rows.append(row)
    return rows
