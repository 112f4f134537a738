"""The lm-evaluation-harness model "pop-hf" on local tasks, offline."""
import json
import math

import pytest
from lm_eval.api.instance import Instance

from pop_analysis import cli
from pop_analysis.harness.lm_eval_model import PopLM, PopLMError
from pop_analysis.quality.metrics import score_continuations
from pop_vllm.run_setting import RunSetting

from tiny import forced_model, tiny_model

GSM8K_GEN = """task: pop_gsm8k_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer.split('####')[-1].strip()}}}}"
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""
SEVENS_GEN = GSM8K_GEN.replace("pop_gsm8k_gen", "pop_sevens_gen")
GSM8K_MC = """task: pop_gsm8k_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: ["88", "77", "87"]
doc_to_target: 1
metric_list:
  - metric: acc
"""
ROLLING = """task: pop_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{question}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def forced_lm(tokenizer, text="7"):
    """Tiny model that always emits `text`'s token: known answers through the harness."""
    return forced_model(tokenizer, text, name="forced-7")[0]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, shared_data):
    d = tmp_path_factory.mktemp("tasks")
    gsm = shared_data / "gsm8k_test.jsonl"
    sevens = d / "sevens.jsonl"
    sevens.write_text("\n".join(json.dumps({"question": f"Say {i}", "answer": "#### 7777"})
                                for i in range(3)) + "\n")
    (d / "gen.yaml").write_text(GSM8K_GEN.format(data=gsm))
    (d / "sevens.yaml").write_text(SEVENS_GEN.format(data=sevens))
    (d / "mc.yaml").write_text(GSM8K_MC.format(data=gsm))
    (d / "rolling.yaml").write_text(ROLLING.format(data=gsm))
    return d


def evaluate(model, tasks_dir, names, limit=2):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)  # local tasks only
    out = simple_evaluate(model=model, tasks=names, limit=limit, task_manager=manager,
                          log_samples=True)
    return out["results"], out["samples"]


def test_forced_model_scores_100_percent_through_the_harness(embedded, tasks):
    model = PopLM(lm=forced_lm(embedded.tokenizer), skip_ratio=0.5)
    assert model.setting.skip == (3, 4, 5)
    results, samples = evaluate(model, tasks, ["pop_sevens_gen", "pop_gsm8k_mc", "pop_gsm8k_gen"])
    assert results["pop_sevens_gen"]["exact_match,none"] == 1.0
    assert results["pop_gsm8k_mc"]["acc,none"] == 1.0  # "77" beats "88" and "87"
    assert results["pop_gsm8k_gen"]["exact_match,none"] == 0.0  # real GSM8K answers are not 7777
    assert samples["pop_gsm8k_gen"][0]["resps"][0][0] == "7777"


def test_loglikelihood_prunes_context_and_scores_continuation_in_full(embedded):
    model = PopLM(lm=embedded, skip="20-29")
    ctx, cont = "The capital of France is", " Paris"
    req = Instance("loglikelihood", {}, (ctx, cont), 0)
    (logprob, greedy), = model.loglikelihood([req])
    ctx_ids = embedded.tokenizer(ctx, add_special_tokens=False)["input_ids"]
    cont_ids = embedded.tokenizer(ctx + cont, add_special_tokens=False)["input_ids"][len(ctx_ids):]
    pop = score_continuations(embedded, ctx_ids, [cont_ids], RunSetting(tuple(range(20, 30))))[0]
    full = score_continuations(embedded, ctx_ids, [cont_ids], RunSetting.full())[0]
    assert abs(logprob - pop.total_logprob) < 1e-4 and greedy == pop.is_greedy
    assert abs(logprob - full.total_logprob) > 1e-4, "POP semantics should change the score"


def test_rolling_loglikelihood_has_nothing_to_prune(embedded, tasks):
    """Rolling windows start from a one-token context: POP and full agree, and are finite."""
    text = "Janet's ducks lay 16 eggs per day."
    req = Instance("loglikelihood_rolling", {}, (text,), 0)
    pop = PopLM(lm=embedded, skip_ratio=0.33).loglikelihood_rolling([req])[0]
    full = PopLM(lm=embedded, variant="full").loglikelihood_rolling([req])[0]
    assert math.isfinite(pop) and abs(pop - full) < 1e-3
    small = PopLM(lm=embedded, max_length=4).loglikelihood_rolling([req])[0]  # several windows
    assert math.isfinite(small) and small < pop  # less context, lower likelihood


def test_bad_model_args(embedded):
    with pytest.raises(PopLMError, match="does not know"):
        PopLM(lm=embedded, skip_rate=0.3)
    with pytest.raises(ValueError, match="not several"):
        PopLM(lm=embedded, skip_ratio=0.3, preset="shallow")
    with pytest.raises(ValueError, match="unknown variant"):
        PopLM(lm=embedded, variant="half")


def test_wrapper_command_runs_a_local_task(tmp_path, tasks, embedded, capsys):
    d = tmp_path / "tiny"
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer))
    tiny.model.save_pretrained(d)
    embedded.tokenizer.save_pretrained(d)
    # No --device and no device= in model_args: the documented command, which defaults to the
    # project's device (CPU here) instead of lm-eval's own cuda:0.
    code = cli.main(["lm_eval", "run", "--model", "pop-hf", "--model_args",
                     f"pretrained={d},skip=3-5", "--tasks", "pop_gsm8k_mc",
                     "--include_path", str(tasks), "--limit", "2"])
    assert code == 0
    assert "pop_gsm8k_mc" in capsys.readouterr().out


def test_bad_task_files(tmp_path, embedded, capsys):
    (tmp_path / "broken.yaml").write_text("task: pop_broken\ndataset_path: json\n"
                                          "dataset_kwargs: {data_files: {test: /nonexistent.jsonl}}\n"
                                          "test_split: test\noutput_type: generate_until\n"
                                          "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n")
    (tmp_path / "garbled.yaml").write_text("task: [unclosed\n")
    model = PopLM(lm=embedded)
    with pytest.raises(Exception, match="nonexistent"):
        evaluate(model, tmp_path, ["pop_broken"], limit=1)
    with pytest.raises(Exception):
        evaluate(model, tmp_path, ["pop_garbled"], limit=1)
    assert cli.main(["lm_eval"]) == 1 and "lm-eval's arguments" in capsys.readouterr().err
