"""The reproduction report's rendering and verdicts, without running a model: each model's own section, verdicts from the intervals, the local lm-eval tasks."""
import pytest

from pop_analysis.experiments.report_checks import ablation_findings, ratio_findings
from pop_analysis.experiments.report_doc import place, slug


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_each_model_renders_only_its_own_section(tmp_path):
    out = tmp_path / "reproduction.md"
    out.write_text(place(out, "model-a", ["# A's report", "", "## Table 3", "a1"]))
    out.write_text(place(out, "model-b", ["# B's report", "b1"]))
    first = out.read_text()
    assert first.startswith("# Reproducing the paper's findings\n")
    assert first.index("## A's report") < first.index("### Table 3") < first.index("## B's report")
    out.write_text(place(out, "model-a", ["# A's report", "a2"]))  # A again: B's section kept
    text = out.read_text()
    assert "a2" in text and "a1" not in text and "### Table 3" not in text and "b1" in text
    assert text.index("a2") < text.index("b1"), "a section keeps its place"
    assert slug("/tmp/x y/model") == "tmp_x_y_model" and slug("gemma3-270m") == "gemma3-270m"


def row(variant, acc, acc_ci, d=None, d_ci=None, nll=0.1, nll_ci=(0.05, 0.15), ratio=None):
    r = {"variant": variant, "retrieval_acc": acc, "retrieval_acc_ci": acc_ci,
         "retrieval_acc_delta": d, "retrieval_acc_delta_ci": d_ci,
         "continuation_nll_delta": None if variant == "full" else nll,
         "continuation_nll_delta_ci": None if variant == "full" else nll_ci}
    if ratio is not None:
        r["skip_ratio"] = ratio
    return r


def test_verdicts_follow_the_intervals():
    nll = {"rows": [row("full", None, None), row("pop", None, None, nll=0.1),
                    row("shallow", None, None, nll=5.0), row("pop_no_kv", None, None, nll=1.0)]}
    clear = {"rows": [row("full", 0.95, (0.91, 0.97)), row("pop", 0.93, (0.89, 0.96), -0.02, (-0.05, 0.01)),
                      row("shallow", 0.0, (0.0, 0.02), -0.95, (-0.98, -0.9)),
                      row("pop_no_kv", 0.6, (0.53, 0.67), -0.35, (-0.42, -0.28))]}
    lines = ablation_findings(nll, clear)
    assert "**matches**" in lines[0] and "POP costs little" in lines[0]
    assert "**matches**" in lines[1]  # POP best
    assert "Shallow pruning collapses" in lines[2] and "**matches**" in lines[2]
    assert "independent KV" in lines[3] and "**does not match**" in lines[3]  # 53-67%: no collapse
    vague = {"rows": [row("full", 1.0, (0.4, 1.0)), row("pop", 0.75, (0.2, 0.99), -0.25, (-0.85, 0.8)),
                      row("shallow", 0.0, (0.0, 0.6), -1.0, (-1.0, 0.3))]}
    lines = ablation_findings(nll, vague)
    assert "**inconclusive**" in lines[0] and "**inconclusive**" in lines[2]
    lines = ablation_findings(nll, None)  # retrieval not computed yet: nothing decided on it
    assert "retrieval not measured" in lines[1] and "**inconclusive**" in lines[1]


def test_ratio_verdicts():
    rows = [dict(skip_ratio=r, continuation_nll_delta=d, prefill_speedup=s, ideal_speedup=i,
                 continuation_nll_delta_ci=None if d is None else (d - .01, d + .01))
            for r, d, s, i in ((0, None, 1.0, 1.0), (0.33, 0.1, 1.3, 1.46), (0.5, 0.3, 1.6, 1.9),
                               (0.6, 0.4, 1.9, 2.3))]
    acc = [row("pop", a, ci, d, dci, ratio=r) for r, a, ci, d, dci in (
        (0.33, 0.9, (0.85, 0.94), -0.02, (-0.06, 0.01)), (0.6, 0.2, (0.15, 0.26), -0.7, (-0.76, -0.64)))]
    lines = ratio_findings({"rows": rows}, {"rows": acc})
    assert "**matches**" in lines[0] and "0.33" in lines[0] and "0.6" in lines[0]
    assert "grows with the ratio" in lines[1] and "**matches**" in lines[1]
    assert "75-95%" in lines[2] and "**matches**" in lines[2]  # 83-89% of ideal


def test_local_mc_tasks_render_and_build_documents(cache, shared_data):
    import datasets

    from pop_analysis.harness.lm_eval_tasks.utils import (
        final_number_docs,
        solution_docs,
    )
    from pop_analysis.harness.mc import LOCAL_TASKS, task_dir

    d = task_dir()
    for task in LOCAL_TASKS:
        text = (d / f"{task}.yaml").read_text()
        assert f"{shared_data.resolve().as_posix()}/gsm8k_test.jsonl" in text and "@DATA_DIR@" not in text
    assert (d / "utils.py").is_file()
    ds = datasets.Dataset.from_list([{"question": f"q{i}", "answer": f"work {i}\n#### {i % 3}"}
                                     for i in range(6)])
    for i, doc in enumerate(final_number_docs(ds)):
        assert doc["choices"][doc["label"]] == str(i % 3) and len(set(doc["choices"])) == len(doc["choices"])
        assert doc["reasoning"] == f"work {i}"
    for i, doc in enumerate(solution_docs(ds)):
        assert doc["choices"][doc["label"]] == ds[i]["answer"] and len(doc["choices"]) == 4
        assert doc["label"] == i % 4


def test_lm_eval_command_finds_the_local_tasks(cache, shared_data):
    from pop_analysis.commands.lm_eval import with_local_tasks
    from pop_analysis.harness.mc import task_dir

    argv = ["run", "--model", "pop-hf", "--tasks", "arc_easy,pop_gsm8k_final"]
    assert with_local_tasks(argv) == [*argv, "--include_path", str(task_dir())]
    assert with_local_tasks(["run", "--tasks", "arc_easy"]) == ["run", "--tasks", "arc_easy"]
    given = ["run", "--tasks", "pop_gsm8k_final", "--include_path", "/mine"]
    assert with_local_tasks(given) == given
