"""The vLLM server lifecycle (pop_analysis.serving) against a real engine on the embedded model.

Two engine starts: one that dies for an unsupported architecture (fails early), and a POP engine
from the `serve` command whose greedy tokens over HTTP must equal POP Lab's pop and whose process
is then SIGKILLed (the watchdog must end the engine). An engine whose front end is killed mid-run,
then stopped, is test_serve_control.py's, after its other tests. A missing serving venv fails this
module with the command that builds it.
"""
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pop_analysis.serving import venv
from pop_analysis.serving.server import Engine, EngineSpec, group_members
from pop_analysis.serving.spec import spec_for
from pop_analysis.serving.venv import ServingError
from pop_analysis.speed.procs import children
from pop_vllm.run_setting import RunSetting, SettingError

from vllm_driver import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serving_venv():
    try:
        return venv.python()
    except ServingError as e:
        pytest.fail(f"{e} (the serving tests need it: bash {venv.INSTALL_SCRIPT})")


@pytest.fixture(scope="module")
def spec(serving_venv, embedded):
    return spec_for("smollm2-135m", RunSetting.full(), max_model_len=1024, kv_cache_gib=1)


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text and text
    return text


def test_missing_venv_one_line(monkeypatch, tmp_path, embedded):
    monkeypatch.setenv("POP_LAB_VLLM_VENV", str(tmp_path / "nowhere"))
    with pytest.raises(ServingError) as e:
        Engine(spec_for("smollm2-135m", RunSetting.full())).start()
    assert "missing" in one_line(e) and venv.INSTALL_SCRIPT in str(e.value)
    (tmp_path / "half" / "bin").mkdir(parents=True)  # a venv without vLLM
    (tmp_path / "half" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("POP_LAB_VLLM_VENV", str(tmp_path / "half"))
    with pytest.raises(ServingError) as e:
        Engine(spec_for("smollm2-135m", RunSetting.full())).start()
    assert "incomplete" in one_line(e) and venv.INSTALL_SCRIPT in str(e.value)


def test_port_in_use_one_line(spec):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        engine = Engine(EngineSpec(**{**spec.__dict__, "port": port}))
        with pytest.raises(ServingError) as e:
            engine.start()
    assert f"port {port}" in one_line(e) and "in use" in str(e.value)
    assert engine.proc is None  # nothing was launched


def test_bad_settings_one_line(spec, tmp_path):
    with pytest.raises(ServingError) as e:
        spec_for("smollm2-135m", RunSetting(()))
    assert "non-empty skip set" in one_line(e)
    with pytest.raises(SettingError) as e:
        spec_for("smollm2-135m", RunSetting((20,), "nonsense"))
    assert "unknown variant" in one_line(e)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                      "num_hidden_layers": 4}))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))  # readable weights
    with pytest.raises(ServingError) as e:
        Engine(spec_for(str(tmp_path), RunSetting((1, 2)))).start()
    assert "GPT2LMHeadModel" in one_line(e)
    for engine, words in (({"tensor_parallel": 2}, "does not divide the model's 9 attention heads"),
                          ({"pipeline_parallel": 31, "eager": False}, "exceeds the model's 30 layers"),
                          ({"pipeline_parallel": 2}, "compiled mode only"),
                          ({"tensor_parallel": 3, "pipeline_parallel": 3, "eager": False}, "need a core each")):
        with pytest.raises(ServingError) as e:  # before anything starts
            spec_for("smollm2-135m", RunSetting((20,)), **engine)
        assert words in one_line(e)


def test_compiled_mode_drops_enforce_eager():
    """The Serve page's Compiled toggle and `serve --compiled` start vLLM without --enforce-eager
    (vLLM then compiles the stock model and the plugin its pieces: tests/test_vllm_compiled.py)."""
    from pop_analysis.serving.server import command

    eager = command(spec_for("smollm2-135m", RunSetting((20, 21))), "python", 8000)
    compiled = command(spec_for("smollm2-135m", RunSetting((20, 21)), eager=False), "python", 8000)
    assert "--enforce-eager" in eager and "--enforce-eager" not in compiled
    assert [a for a in eager if a != "--enforce-eager"] == compiled


def test_pop_repair_spec_passes_the_maps_file(spec, tmp_path):
    from pop_analysis.serving.server import command

    maps = tmp_path / "KEY.safetensors"
    maps.write_bytes(b"")  # the engine reads it; the spec only needs it to exist
    s = spec_for("smollm2-135m", RunSetting((20, 21), "pop_repair", str(maps)))
    cmd = command(s, "python", 8000)
    pop = json.loads(cmd[cmd.index("--hf-overrides") + 1])["pop"]
    assert pop == {"skip": [20, 21], "variant": "pop_repair", "repair": str(maps)}
    for args, words in ((((20,), "pop_repair"), "needs a repair"),
                        (((20,), "pop_no_kv"), "not supported in vLLM"),
                        (((20,), "static"), "removes layers in decode too")):
        with pytest.raises(ServingError) as e:
            spec_for("smollm2-135m", RunSetting(*args))
        assert words in one_line(e)
    with pytest.raises(SettingError) as e:  # refused where the setting is built
        RunSetting((20,), "pop", str(maps))
    assert "pop_repair only" in one_line(e)


def test_unsupported_architecture_one_line(spec, tmp_path):
    """Stock vLLM refuses an architecture it does not know: the engine's death reads as one line."""
    cfg = json.loads((Path(spec.model_dir) / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / f).symlink_to(Path(spec.model_dir) / f)
    engine = Engine(EngineSpec(**{**spec.__dict__, "model_dir": str(tmp_path)}))
    with pytest.raises(ServingError) as e:
        engine.start(timeout_s=240)
    assert "NoSuchModelForCausalLM" in one_line(e) and "not supported" in str(e.value)
    assert not group_members(engine.proc.pid)


def cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "pop_analysis", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_cli_bad_input_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        for args, words in ((["serve", "--port", str(port), "--variant", "full"], "in use"),
                            (["serve-bench", "--request-rates", "0"], "finite number in (0,"),
                            (["serve-bench", "--input-len", "5000"], "prompt tokens"),
                            (["serve", "--skip", "40", "--port", "0"], "40"),
                            (["serve", "--variant", "pop_repair", "--skip", "20-29"], "--repair"),
                            (["serve", "--repair", "auto", "--skip", "20-29"], "pop_repair"),
                            (["serve-bench", "--variant", "pop_repair", "--skip", "20-29",
                              "--repair", "0123456789abcdef0123"], "no stored repair")):
            p = cli(*args)
            out, err = p.communicate(timeout=120)
            code = 2 if "--request-rates" in args else 1  # a flag's own check: argparse's exit 2
            assert p.returncode == code and err.count("\n") == 1 and words in err, (args, err)


HTTP_TEXTS = ["What is the capital of France?", "List three prime numbers.",
              "Explain in one sentence why the sky is blue."]


def pop_lab_tokens(lm, variant: str, skip, n_new: int = 8):
    from pop_analysis.engine.generate import SamplingConfig, encode, run

    prompts = [encode(lm, t) for t in HTTP_TEXTS]
    cfg = SamplingConfig(max_new_tokens=n_new, stop_at_eos=False)
    setting = RunSetting(skip, variant)
    return prompts, [run(lm, ids, setting, cfg).token_ids for ids in prompts]


def completion_token_ids(url: str, prompts, n_new: int = 8) -> list[list[int]]:
    """Greedy completions of token-id prompts in one request (served as one batch), as the
    generated token ids vLLM returns (return_token_ids)."""
    body = json.dumps({"model": "smollm2-135m", "prompt": prompts, "max_tokens": n_new,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True}).encode()
    req = urllib.request.Request(f"{url}/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choices = sorted(json.load(r)["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices]


def test_cli_serve_pop_then_parent_killed(spec, embedded):
    """`serve` prints its URL and command; its greedy tokens over HTTP equal POP Lab's pop;
    SIGKILL of the CLI (no atexit) ends the engine."""
    p = cli("serve", "--skip", "20-29", "--port", "0", "--max-model-len", "1024", "--json")
    try:
        prompts, want = pop_lab_tokens(embedded, "pop", range(20, 30))  # while the engine starts
        info = json.loads(p.stdout.readline())
        assert info["url"].startswith("http://127.0.0.1:") and info["skip_layers"] == list(range(20, 30))
        assert "--hf-overrides" in info["command"] and "PopLlamaForCausalLM" in info["command"]
        body = json.dumps({"model": "smollm2-135m", "prompt": "The sky is", "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"{info['url']}/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.load(r)["choices"][0]["text"].strip()
        assert completion_token_ids(info["url"], prompts) == want
        assert want != pop_lab_tokens(embedded, "full", ())[1]  # POP changes them: it can fail
        engines = children(p.pid)
        assert engines, "no watchdog under the CLI"
        pgid = engines[0]
        assert group_members(pgid)
        p.kill()
        p.wait(timeout=10)
        wait_until(lambda: not group_members(pgid), 30, "the engine outlived the CLI")
    finally:
        p.kill()
        p.wait()
