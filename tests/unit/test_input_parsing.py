"""Bad input gets one clear line before any work: model names and folders, skip sets and huge ranges, prompts, prompt ids, sampling settings, thread counts, variants."""
import math
import shutil
import tracemalloc

import pytest
import torch

from pop_analysis import cli
from pop_analysis.cli import main
from pop_analysis.commands import generate as generate_cmd
from pop_analysis.commands.lm_eval import with_device
from pop_analysis.engine.adapter import DecoderAdapter, UnsupportedArchitecture
from pop_analysis.engine.generate import SamplingConfig, SamplingError, encode, run
from pop_analysis.engine.models import ModelLoadError, default_device, load_model
from pop_analysis.engine.pop import PromptError, run_prompt
from pop_analysis.engine.skipset import (
    SettingError,
    describe,
    parse_layers,
    preset,
    resolve,
)
from pop_analysis.errors import InputError
from pop_vllm.run_setting import RunSetting

from cli_lines import last_error_line, one_error_line
from tiny import tiny_model


def test_unknown_model_names_the_choices():
    with pytest.raises(ModelLoadError, match="unknown model 'no-such-model'.*smollm2-135m"):
        load_model("no-such-model")


def test_local_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot read the config"):
        load_model(str(tmp_path))


def test_unsupported_architecture_lists_supported(tmp_path):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="unsupported architecture.*supported: .*llama"):
        load_model(str(tmp_path))


def test_adapter_refuses_unsupported_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UnsupportedArchitecture, match="gpt2"):
        DecoderAdapter(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2)))


def test_local_directory_model_without_tokenizer(tmp_path):
    lm = tiny_model("llama")
    lm.model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert loaded.tokenizer is None and loaded.adapter.n_layers == 6
    out = run(loaded, [1, 2, 3], RunSetting((4, 5)),
              SamplingConfig(max_new_tokens=3, stop_at_eos=False))
    assert len(out.token_ids) == 3 and out.text is None
    with pytest.raises(ValueError, match="no tokenizer"):
        encode(loaded, "hello")


@pytest.mark.parametrize("layers, message", [
    ((30,), r"out of range: the model has layers 0..29"),
    ((-1,), r"out of range"),
    (tuple(range(30)), "cannot skip all 30 layers"),
])
def test_impossible_skip_sets(layers, message):
    with pytest.raises(SettingError, match=message):
        resolve(30, layers=layers)


def test_skip_set_parsing_and_ratio():
    assert parse_layers("20-22, 5") == (5, 20, 21, 22)
    assert resolve(30, ratio=0.33) == tuple(range(20, 30))
    assert resolve(30, ratio=0.0) == ()
    assert preset("shallow", 30) == tuple(range(10))
    assert preset("interleaved", 30) == tuple(range(2, 30, 3))
    assert describe((3, 20, 21, 22)) == "3, 20-22"
    for bad in ("a-b", "5-3", "x"):
        with pytest.raises(SettingError):
            parse_layers(bad)
    with pytest.raises(SettingError, match=r"\[0, 1\)"):
        resolve(30, ratio=1.0)
    with pytest.raises(SettingError, match="not several"):
        resolve(30, layers="1", ratio=0.2)
    with pytest.raises(SettingError, match="unknown preset"):
        preset("deep", 30)


def test_empty_prompt_and_prompt_too_long():
    lm = tiny_model("llama")  # context 256
    with pytest.raises(PromptError, match="empty"):
        run(lm, [], RunSetting((5,)), SamplingConfig(max_new_tokens=2))
    with pytest.raises(PromptError, match="exceeds the model's context of 256"):
        run(lm, [1] * 250, RunSetting((5,)), SamplingConfig(max_new_tokens=10))


def test_unknown_variant():
    lm = tiny_model("llama")
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        run_prompt(lm.adapter, torch.tensor([[1, 2]]), RunSetting((), "fast"))


@pytest.mark.parametrize("text", ["0-20000000", "5-99999999999999999999", "0-9," * 3 + "0-20000000"])
def test_huge_ranges_fail_before_any_list_is_built(text):
    tracemalloc.start()
    with pytest.raises(SettingError, match="out of range: the model has layers 0..29") as e:
        resolve(30, layers=text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(str(e.value)) < 160 and peak < 1 << 20  # no 2.2 GB list, no 17 MB message
    with pytest.raises(SettingError, match="out of range"):
        parse_layers(text)  # without a model: bounded by MAX_LAYERS


def test_cli_huge_skip_range_is_one_short_line(capsys, tmp_path):
    tiny_model("llama").model.save_pretrained(tmp_path)
    capsys.readouterr()  # the save's progress bar is not the command's output
    with pytest.raises(SystemExit) as e:  # refused while the flags are parsed, before the load
        main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2", "--skip", "0-20000000"])
    line = one_error_line(capsys)
    assert e.value.code == 2 and "out of range: layer numbers stop at 9999" in line
    assert len(line) < 200
    assert main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2", "--skip", "6"]) == 1
    assert "out of range: the model has layers 0..5" in one_error_line(capsys)  # after the load


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
    (["--max-new-tokens", "0"], "--max-new-tokens: must be a whole number in 1..16777216, got '0'"),
    (["--temperature", "-1"], "--temperature: must be a finite number in [0, 100], got '-1'"),
    (["--top-p", "nan"], "--top-p: must be a finite number in (0, 1], got 'nan'"),
])
def test_cli_sampling_flags_fail_before_the_model_loads(flags, why, capsys, monkeypatch):
    import pop_analysis.commands.generate as command

    monkeypatch.setattr(command, "load", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:  # refused while the flags are parsed
        main(["generate", "--prompt", "hi", *flags])
    assert e.value.code == 2 and why in one_error_line(capsys)


@pytest.mark.parametrize("text, why", [(",", "holds no numbers"), (" , ,", "holds no numbers"),
                                       ("1,-2", "each value must be a whole number in 0..2147483647"),
                                       ("1e3", "each value must be a whole number"),
                                       ("9" * 50, "each value must be a whole number")])
def test_prompt_ids_parse_to_one_clean_line(text, why, capsys, monkeypatch):
    import pop_analysis.commands.generate as command

    monkeypatch.setattr(command, "load", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:  # refused while the flags are parsed
        main(["generate", f"--prompt-ids={text}"])
    assert e.value.code == 2
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


def test_lm_eval_wrapper_adds_the_project_device_unless_one_is_named():
    """tests/test_lm_eval.py runs the documented command itself (no device given)."""
    base = ["run", "--model", "pop-hf", "--tasks", "x"]
    assert with_device(base) == [*base, "--device", default_device()]
    for named in (["--device", "cpu"], ["--device=cuda:1"], ["--config", "c.yaml"]):
        assert with_device(base + named) == base + named
    assert with_device(["ls", "tasks"]) == ["ls", "tasks"]


def test_threads_beyond_the_machine_are_one_line(capsys):
    assert cli.main(["generate", "--prompt", "hi", "--threads", "100000"]) == 1
    line = last_error_line(capsys)
    assert "--threads 100000" in line and "CPU" in line and "MemoryError" not in line, line


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
