"""Bad input against the embedded model's context and tokenizer: long prompts, answers and retrieval lengths refused before tokenising or building, non-UTF-8 prompts and files, unwritable outputs, lm-eval arguments."""
import dataclasses
import json
import time

import pytest
from cli_lines import last_error_line, one_error_line

from pop_analysis import cli
from pop_analysis.cli import main
from pop_analysis.commands import generate as generate_cmd
from pop_analysis.commands import sweep as sweep_cmd
from pop_analysis.data.readers import DatasetError
from pop_analysis.engine.generate import encode
from pop_analysis.engine.pop import PromptError
from pop_analysis.quality.retrieval import (
    RetrievalConfig,
    RetrievalError,
    retrieval_items,
)


def test_empty_text_prompt(embedded):
    with pytest.raises(ValueError, match="empty"):
        encode(embedded, "   ")


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


def test_a_long_prompt_in_a_data_set_is_refused_before_calibration_tokenises(embedded, tmp_path,
                                                                             monkeypatch, capsys):
    from pop_analysis.commands import calibrate as calibrate_cmd

    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "many words " * 20000}) + "\n")
    monkeypatch.setattr(calibrate_cmd, "load", lambda args: embedded)
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    assert cli.main(["calibrate", "--dataset", str(data), "--samples", "1"]) == 1
    assert "more than the model's context of 8192 tokens can hold" in last_error_line(capsys)


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
    for flags in (["--lengths", "512,40000"], ["--retrieval-length", "40000"]):
        assert cli.main(["report", *flags, "--out", str(tmp_path / "r.md")]) == 1
        assert "exceeds the model's context of 8192 tokens" in last_error_line(capsys)


def test_a_prompt_that_is_not_utf8_is_one_line(embedded, monkeypatch, capsys):
    monkeypatch.setattr(generate_cmd, "load", lambda args: embedded)
    bad = b"caf\xe9 au lait".decode("utf-8", "surrogateescape")  # how argv holds such bytes
    assert cli.main(["generate", "--prompt", bad, "--max-new-tokens", "2"]) == 1
    assert "the prompt is not UTF-8 text" in last_error_line(capsys)


def test_an_unwritable_csv_is_refused_before_the_sweep_runs(embedded, tmp_path, monkeypatch,
                                                            capsys):
    monkeypatch.setattr(sweep_cmd, "load", lambda args: embedded)
    monkeypatch.setattr(sweep_cmd, "cached_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    (tmp_path / "file").write_text("")
    assert cli.main(["sweep", "--csv", str(tmp_path / "file" / "rows.csv")]) == 1
    line = last_error_line(capsys)
    assert "--csv" in line and "rows.csv" in line, line


def test_lm_eval_model_args_that_are_not_integers_are_one_line(embedded):
    from pop_analysis.harness.lm_eval_model import PopLM, PopLMError

    for args in ({"max_length": "abc"}, {"max_gen_toks": "-3"}, {"threads": "x"}):
        with pytest.raises(PopLMError) as e:
            PopLM(lm=embedded, **args)
        name = next(iter(args))
        assert f"model_args {name}" in str(e.value) and "invalid literal" not in str(e.value)


def test_drift_checks_every_length_before_the_first_runs(embedded, capsys, monkeypatch):
    import pop_analysis.commands.drift as command
    import pop_analysis.inspection.drift as drift

    monkeypatch.setattr(command, "load", lambda args: embedded)
    monkeypatch.setattr(drift, "_run", lambda *a, **k: pytest.fail("drift ran"))
    assert main(["drift", "--prompt", "Hello there, how are you?", "--lengths", "16,100000",
                 "--no-cache"]) == 1
    assert "100000 tokens" in one_error_line(capsys)


def test_latin1_text_source_names_the_file(embedded, tmp_path, capsys, monkeypatch):
    import pop_analysis.commands.drift as command
    from pop_analysis.inspection.drift_length import read_texts

    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\u00e9 au lait, cr\u00e8me br\u00fbl\u00e9e.\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1\.txt line 1: not UTF-8 text"):
        read_texts(str(path))
    monkeypatch.setattr(command, "load", lambda args: embedded)
    assert main(["drift", "--prompt", "Hello there, how are you?", "--lengths", "16",
                 "--text-source", str(path), "--decode-steps", "1", "--no-cache"]) == 1
    assert "latin1.txt line 1: not UTF-8 text" in one_error_line(capsys)


def test_a_timeout_that_never_ends_is_one_line_from_the_real_entry_point():
    """The CLI process itself (argparse's exit through __main__): one line, exit code 2. The
    property over every numeric option runs in process: tests/unit/test_cli_numeric_options.py."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "pop_analysis", "serve", "--start-timeout", "inf"],
                         cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.splitlines() == [
        "error: argument --start-timeout: must be a finite number of seconds in (0, 86400], got "
        "'inf' (see python -m pop_analysis serve --help)"]
