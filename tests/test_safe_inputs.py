"""Edge inputs get one clear line before any work (issue 13, findings 4, 5, 7 and 8)."""
import math
import tracemalloc

import pytest

from pop_analysis.cli import main
from pop_analysis.commands.generate import parse_ids
from pop_analysis.commands.lm_eval import with_device
from pop_analysis.data.prompts import DatasetError, load_prompts
from pop_analysis.errors import InputError
from pop_analysis.engine.generate import SamplingConfig, SamplingError
from pop_analysis.engine.models import default_device
from pop_analysis.engine.skipset import SkipSetError, parse_layers, resolve
from tiny import tiny_model


def one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --- 4: skip-set ranges are checked before a list is built ----------------------------------

@pytest.mark.parametrize("text", ["0-20000000", "5-99999999999999999999", "0-9," * 3 + "0-20000000"])
def test_huge_ranges_fail_before_any_list_is_built(text):
    tracemalloc.start()
    with pytest.raises(SkipSetError, match="out of range: the model has layers 0..29") as e:
        resolve(30, layers=text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(str(e.value)) < 160 and peak < 1 << 20  # no 2.2 GB list, no 17 MB message
    with pytest.raises(SkipSetError, match="out of range"):
        parse_layers(text)  # without a model: bounded by MAX_LAYERS


def test_cli_huge_skip_range_is_one_short_line(capsys, tmp_path):
    tiny_model("llama").model.save_pretrained(tmp_path)
    capsys.readouterr()  # the save's progress bar is not the command's output
    assert main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2",
                 "--skip", "0-20000000"]) == 1
    line = one_error_line(capsys)
    assert "out of range: the model has layers 0..5" in line and len(line) < 160


# --- 5 and 7: sampling parameters and prompt ids ----------------------------------------------

@pytest.mark.parametrize("kw, why", [
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": math.nan}, r"top_p must be a number in \(0, 1\]"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": -1}, "seed"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
])
def test_sampling_config_refuses_impossible_values(kw, why):
    with pytest.raises(SamplingError, match=why):
        SamplingConfig(**kw)


def test_sampling_config_accepts_the_edges():
    SamplingConfig(max_new_tokens=1, temperature=0.0, top_p=1.0)
    SamplingConfig(temperature=1e-3, top_p=1e-9, seed=2 ** 63 - 1)


@pytest.mark.parametrize("flags, why", [
    (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--top-p", "nan"], "top_p must be a number in (0, 1]"),
])
def test_cli_sampling_flags_fail_before_the_model_loads(flags, why, capsys, monkeypatch):
    import pop_analysis.commands.generate as command

    monkeypatch.setattr(command, "load", lambda args: pytest.fail("the model was loaded"))
    assert main(["generate", "--prompt", "hi", *flags]) == 1
    assert why in one_error_line(capsys)


@pytest.mark.parametrize("text, why", [(",", "holds no numbers"), (" , ,", "holds no numbers"),
                                       ("1,-2", "comma-separated integers"),
                                       ("1e3", "comma-separated integers"),
                                       ("9" * 50, "too large")])
def test_prompt_ids_parse_to_one_clean_line(text, why, capsys, monkeypatch):
    with pytest.raises(InputError, match=why):
        parse_ids(text)
    import pop_analysis.commands.generate as command

    monkeypatch.setattr(command, "load", lambda args: pytest.fail("the model was loaded"))
    assert main(["generate", "--prompt-ids", text]) == 1
    line = one_error_line(capsys)
    assert why in line and "torch" not in line.lower()


def test_context_check_runs_before_any_forward_pass(capsys, monkeypatch, tmp_path):
    """A prompt longer than the context is refused before the warm-up (it used to compute first)."""
    import pop_analysis.engine.pop as pop

    tiny_model("llama").model.save_pretrained(tmp_path)  # context 256
    capsys.readouterr()  # the save's progress bar is not the command's output
    calls = []
    monkeypatch.setattr(pop, "run_prompt", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(pop.DecoderAdapter, "embed", lambda *a, **k: calls.append(1), raising=False)
    ids = ",".join(["7"] * 10_000)
    assert main(["generate", "--model", str(tmp_path), "--prompt-ids", ids, "--skip", "4-5"]) == 1
    assert "exceeds the model's context of 256 tokens" in one_error_line(capsys)
    assert calls == [], "model work ran before the context check"


def test_bench_checks_every_length_before_the_first_is_timed(capsys, monkeypatch, tmp_path):
    import pop_analysis.speed.bench as bench

    tiny_model("llama").model.save_pretrained(tmp_path)  # context 256
    capsys.readouterr()  # the save's progress bar is not the command's output
    monkeypatch.setattr(bench, "bench_length", lambda *a, **k: pytest.fail("timed a length"))
    assert main(["bench", "--model", str(tmp_path), "--lengths", "16,9000", "--skip", "4-5"]) == 1
    assert "exceeds the model's context of 256 tokens" in one_error_line(capsys)


def test_drift_checks_every_length_before_the_first_runs(embedded, capsys, monkeypatch):
    import pop_analysis.commands.drift as command
    import pop_analysis.inspection.drift as drift

    monkeypatch.setattr(command, "load", lambda args: embedded)
    monkeypatch.setattr(drift, "_run", lambda *a, **k: pytest.fail("drift ran"))
    assert main(["drift", "--prompt", "Hello there, how are you?", "--lengths", "16,100000",
                 "--no-cache"]) == 1
    assert "100000 tokens" in one_error_line(capsys)


# --- 7: data files ----------------------------------------------------------------------------

SPARSE = 200 * 2 ** 20  # a 200 MB file that takes no disk (sparse): NUL bytes after the records


def sparse_file(path, head: str):
    with open(path, "wb") as f:
        f.write(head.encode())
        f.truncate(SPARSE)
    return path


@pytest.mark.parametrize("name, head", [
    ("big.jsonl", '{"prompt": "one"}\n{"prompt": "two"}\n'),
    ("big.json", '[{"prompt": "one"}, {"prompt": "two"}, '),
    ("big.csv", "prompt,id\none,1\ntwo,2\n"),
    ("big.txt", "one\ntwo\n"),
])
def test_readers_stop_after_the_prompts_needed(tmp_path, name, head):
    """The rest of each file is 200 MB of NUL bytes, which no reader accepts: reading 2 prompts
    succeeds only if the reader stops after them."""
    path = sparse_file(tmp_path / name, head)
    assert load_prompts(str(path), limit=2).prompts == ("one", "two")
    with pytest.raises(DatasetError, match=name.replace(".", r"\.")):
        load_prompts(str(path), limit=3)


@pytest.mark.parametrize("name, head", [
    ("big.jsonl", '{"question": "one"}\n{"question": "two"}\n'),
    ("big.json", '[{"question": "one"}, {"question": "two"}, '),
    ("big.txt", "one\ntwo\n"),
])
def test_evaluation_reads_stop_after_the_items_needed(tmp_path, name, head):
    from pop_analysis.quality.evalsets import read_records
    from pop_analysis.quality.items import EvalDataError

    path = sparse_file(tmp_path / name, head)
    assert [r.get("question", r.get("prompt")) for r in read_records(path, 2)] == ["one", "two"]
    with pytest.raises(EvalDataError, match=name.replace(".", r"\.")):
        read_records(path, 3)


def test_unterminated_csv_quote_names_the_file_and_line(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text('prompt,id\nfine,1\n"never closed,2\nthree,3\nfour,4\n')
    with pytest.raises(DatasetError, match=r"quoted\.csv line 3: a quoted field opened here is "
                                           "never closed"):
        load_prompts(str(path))
    assert load_prompts(str(path), limit=1).prompts == ("fine",)  # before the bad line: fine


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


# --- 8: the documented lm-eval command on a CPU-only machine ---------------------------------

def test_lm_eval_wrapper_adds_the_project_device_unless_one_is_named():
    """tests/test_lm_eval.py runs the documented command itself (no device given)."""
    base = ["run", "--model", "pop-hf", "--tasks", "x"]
    assert with_device(base) == [*base, "--device", default_device()]
    for named in (["--device", "cpu"], ["--device=cuda:1"], ["--config", "c.yaml"]):
        assert with_device(base + named) == base + named
    assert with_device(["ls", "tasks"]) == ["ls", "tasks"]
