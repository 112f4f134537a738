"""Every input bounded before it is expanded, and plain one-line messages (issue 22, items 3 and
5): long prompts and files are refused before tokenising, lengths beyond the context before any
prompt is built, and the smaller findings each read as one line."""
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from pop_analysis import cli
from pop_analysis.commands import generate as generate_cmd
from pop_analysis.commands import sweep as sweep_cmd
from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.generate import encode
from pop_analysis.engine.pop import PromptError
from pop_analysis.data.readers import DatasetError
from pop_analysis.quality.retrieval import RetrievalConfig, RetrievalError, retrieval_items

ROOT = Path(__file__).resolve().parent.parent


class CountingTokenizer:
    """The model's tokenizer, recording the longest text it was asked to tokenise."""

    def __init__(self, tok):
        self._tok, self.longest = tok, 0

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, text, *a, **kw):
        self.longest = max(self.longest, len(text))
        return self._tok(text, *a, **kw)

    def apply_chat_template(self, messages, *a, **kw):
        self.longest = max(self.longest, sum(len(m["content"]) for m in messages))
        return self._tok.apply_chat_template(messages, *a, **kw)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), err
    return lines[-1]


# --- bounded before expanded -------------------------------------------------------------------

def test_a_prompt_longer_than_the_context_can_hold_is_never_tokenised(embedded):
    from pop_analysis.engine.pop import max_prompt_chars

    spy = CountingTokenizer(embedded.tokenizer)
    lm = dataclasses.replace(embedded, tokenizer=spy)
    limit = max_prompt_chars(lm.adapter)
    assert limit == 16 * lm.adapter.shape.max_positions
    with pytest.raises(PromptError) as e:
        encode(lm, "word " * limit)
    assert spy.longest == 0, "the text reached the tokenizer"
    assert "characters" in str(e.value) and "8192 tokens" in str(e.value)
    assert encode(lm, "x" * 1000)  # a long but possible prompt still tokenises


def test_a_huge_one_line_prompt_file_is_refused_while_reading(tmp_path):
    from pop_analysis.data.readers import MAX_LINE_BYTES

    big = tmp_path / "one_line.txt"
    with open(big, "wb") as f:
        f.write(b"word " * ((MAX_LINE_BYTES // 5) + 1000))  # one line, just over the bound
    t0 = time.perf_counter()
    with pytest.raises(DatasetError, match=r"one_line.txt line 1: longer than 16 MiB"):
        load_prompts(str(big))
    assert time.perf_counter() - t0 < 5


def test_a_long_prompt_in_a_data_set_is_refused_before_calibration_tokenises(embedded, tmp_path,
                                                                             monkeypatch, capsys):
    from pop_analysis.commands import calibrate as calibrate_cmd

    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "many words " * 20000}) + "\n")
    monkeypatch.setattr(calibrate_cmd, "load", lambda args: embedded)
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    assert cli.main(["calibrate", "--dataset", str(data), "--samples", "1"]) == 1
    assert "more than the model's context of 8192 tokens can hold" in one_error_line(capsys)


def test_a_long_reference_answer_is_refused_before_tokenising(embedded):
    from pop_analysis.quality.evalsets import records_to_items

    spy = CountingTokenizer(embedded.tokenizer)
    lm = dataclasses.replace(embedded, tokenizer=spy)
    record = {"prompt": "What is two and two?", "answer": "four " * 40000}
    with pytest.raises(PromptError, match="the reference answer is 200000 characters"):
        records_to_items(lm, [record], "long.jsonl")
    assert spy.longest < 1000, "the reference reached the tokenizer"


def test_retrieval_lengths_beyond_the_context_are_refused_before_building(embedded):
    t0 = time.perf_counter()
    with pytest.raises(RetrievalError, match="exceeds the model's context of 8192 tokens"):
        retrieval_items(embedded, RetrievalConfig(n_items=1, length=50_000_000))
    assert time.perf_counter() - t0 < 2


def test_report_lengths_beyond_the_context_are_refused_before_any_part_runs(embedded, tmp_path,
                                                                           monkeypatch, capsys):
    from pop_analysis.commands import report as report_cmd

    monkeypatch.setattr(report_cmd, "load", lambda args: embedded)
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # the command sets them process-wide
        monkeypatch.setenv(name, "1")  # monkeypatch puts back what was there before
    monkeypatch.setattr(report_cmd, "collect", lambda *a, **k: pytest.fail("a part ran"))
    for flags in (["--lengths", "512,40000000"], ["--retrieval-length", "40000000"]):
        assert cli.main(["report", *flags, "--out", str(tmp_path / "r.md")]) == 1
        assert "exceeds the model's context of 8192 tokens" in one_error_line(capsys)


def test_the_dashboard_caps_uploads_at_a_useful_size():
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] == 32  # MB: a prompt file, not a whole corpus


# --- plain messages ----------------------------------------------------------------------------

def test_threads_beyond_the_machine_are_one_line(capsys):
    assert cli.main(["generate", "--prompt", "hi", "--threads", "100000"]) == 1
    line = one_error_line(capsys)
    assert "--threads 100000" in line and "CPU" in line and "MemoryError" not in line, line


def test_a_prompt_that_is_not_utf8_is_one_line(embedded, monkeypatch, capsys):
    monkeypatch.setattr(generate_cmd, "load", lambda args: embedded)
    bad = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # how argv holds such bytes
    assert cli.main(["generate", "--prompt", bad, "--max-new-tokens", "2"]) == 1
    assert "the prompt is not UTF-8 text" in one_error_line(capsys)


def test_an_unwritable_csv_is_refused_before_the_sweep_runs(embedded, tmp_path, monkeypatch,
                                                            capsys):
    monkeypatch.setattr(sweep_cmd, "load", lambda args: embedded)
    monkeypatch.setattr(sweep_cmd, "cached_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    (tmp_path / "file").write_text("")
    assert cli.main(["sweep", "--csv", str(tmp_path / "file" / "rows.csv")]) == 1
    line = one_error_line(capsys)
    assert "--csv" in line and "rows.csv" in line, line


def test_lm_eval_model_args_that_are_not_integers_are_one_line(embedded):
    from pop_analysis.harness.lm_eval_model import PopLM, PopLMError

    for args in ({"max_length": "abc"}, {"max_gen_toks": "-3"}, {"threads": "x"}):
        with pytest.raises(PopLMError) as e:
            PopLM(lm=embedded, **args)
        name = next(iter(args))
        assert f"model_args {name}" in str(e.value) and "invalid literal" not in str(e.value)


def test_an_error_after_a_progress_bar_starts_its_own_line(monkeypatch, capsys):
    from pop_analysis.progress import Progress, terminal_bar

    def fails(args):
        terminal_bar(Progress(done=1, total=4, elapsed_s=1.0, message="working"))
        raise ValueError("it broke")

    monkeypatch.setattr(generate_cmd, "run", fails)
    assert cli.main(["generate", "--prompt", "x"]) == 1
    err = capsys.readouterr().err
    assert "\nerror: it broke" in err and err.rstrip().endswith("error: it broke"), repr(err)


def test_a_truncated_converted_model_says_to_delete_it(tmp_path, monkeypatch):
    from pop_analysis.engine.models import ModelLoadError, converted_dir, load_model

    source = converted_dir("smollm2-135m")
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    folder = converted_dir("smollm2-135m")
    folder.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, folder / f.name)
    with open(source / "model.safetensors", "rb") as f:
        (folder / "model.safetensors").write_bytes(f.read(1 << 20))  # the first MiB only
    with pytest.raises(ModelLoadError) as e:
        load_model("smollm2-135m", device="cpu")
    assert f"delete {folder}" in str(e.value) and "\n" not in str(e.value), str(e.value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
