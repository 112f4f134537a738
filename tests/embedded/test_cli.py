"""The CLI end to end (in-process and as `python -m pop_analysis`): JSON schemas, one-line errors with a non-zero exit, checks before any model work."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pop_analysis.cli import main

from tiny import saved, tiny_model

TIMING_KEYS = ("speedup_range", "timing_rounds", "timing_trustworthy", "timing_note",
               "roofline_speedup")


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_generate_json_schema(capsys):
    rc = main(["generate", "--prompt", "What is 3+4?", "--max-new-tokens", "6",
               "--variants", "full,pop,static", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert set(out) >= {"model", "n_layers", "skip_layers", "prompt_tokens", "runs", "prefill_speedup"}
    assert set(out) >= set(TIMING_KEYS)
    assert out["skip_layers"] == list(range(20, 30)) and out["n_layers"] == 30
    for v in ("full", "pop", "static"):
        run = out["runs"][v]
        assert set(run) >= {"text", "token_ids", "ttft_ms", "decode_tokens_per_s"}
        assert len(run["token_ids"]) <= 6 and run["ttft_ms"] > 0 and isinstance(run["text"], str)
    # The speedup is the protocol's median of per-round ratios, not the streamed runs' ratio.
    t = out["timing"]
    assert out["timing_rounds"] == len(t["full_ms"]) == len(t["pop_ms"]) >= 3
    assert t["first"][:3] == ["full", "variant", "full"], "order swapped every round"
    ratios = sorted(f / p for f, p in zip(t["full_ms"], t["pop_ms"]))
    assert ratios[0] <= out["speedup_range"][0] <= out["prefill_speedup"] <= out["speedup_range"][1]
    assert out["speedup_range"][1] <= ratios[-1]
    assert out["roofline_speedup"] > 1 and out["ideal_speedup"] > 1
    assert isinstance(out["timing_trustworthy"], bool)
    assert out["timing_trustworthy"] == (out["timing_note"] is None)


def test_generate_prompt_ids_on_model_without_tokenizer(tmp_path, capsys):
    tiny_model("qwen3").model.save_pretrained(tmp_path)
    rc = main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2,3,4", "--skip", "4-5",
               "--max-new-tokens", "3", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert out["runs"]["pop"]["text"] is None and len(out["runs"]["pop"]["token_ids"]) == 3
    assert out["skip_layers"] == [4, 5]


def test_bench_json_schema(capsys):
    rc = main(["bench", "--lengths", "16,48", "--repeats", "1", "--threads", "2",
               "--timing-budget", "0.2", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert out["threads"] == 2 and out["skip_layers"] == list(range(20, 30))
    assert [r["length"] for r in out["rows"]] == [16, 48]
    for r in out["rows"]:
        assert r["ttft_full_ms"] > 0 and r["ttft_pop_ms"] > 0 and r["ideal_speedup"] > 1
        assert set(r) >= set(TIMING_KEYS) and r["timing_rounds"] >= 3, "at least 3 rounds"
        lo, hi = r["speedup_range"]
        assert lo <= r["speedup"] <= hi
        assert r["share_of_flop_ideal"] == pytest.approx(r["speedup"] / r["ideal_speedup"], rel=1e-3)


ROUNDS = "must be a whole number in 1..50"
BUDGET = "must be a finite number of seconds in (0, 3600]"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--repeats", "0"], f"--repeats: {ROUNDS}"),
    (["bench", "--repeats", "51"], f"--repeats: {ROUNDS}"),
    (["bench", "--timing-budget", "0"], f"--timing-budget: {BUDGET}"),
    (["generate", "--prompt", "x", "--timing-rounds", "0"], f"--timing-rounds: {ROUNDS}"),
    (["generate", "--prompt", "x", "--timing-budget", "-1"], f"--timing-budget: {BUDGET}"),
    (["sweep", "--repeats", "0"], f"--repeats: {ROUNDS}"),
    (["sweep", "--timing-budget", "0"], f"--timing-budget: {BUDGET}"),
])
def test_bad_timing_input_is_one_line_and_loads_nothing(argv, message, capsys, monkeypatch):
    import pop_analysis.commands._common as common

    def no_load(*a, **k):
        raise AssertionError("a model was loaded for bad input")

    monkeypatch.setattr(common, "load_model", no_load)
    with pytest.raises(SystemExit) as e:  # refused while the flags are parsed
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_generate_checks_the_context_before_any_model_work(capsys, monkeypatch):
    import pop_analysis.commands.generate as gen

    def no_work(*a, **k):
        raise AssertionError("model work before the context check")

    monkeypatch.setattr(gen, "warm_up", no_work)
    monkeypatch.setattr(gen, "run_generation", no_work)
    assert main(["generate", "--prompt-ids", ",".join(["5"] * 8100), "--max-new-tokens", "200"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exceeds the model's context" in err[0], err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "nope", "--prompt", "x"], "unknown model 'nope'"),
    (["generate", "--prompt", "x", "--skip", "0-29"], "cannot skip all 30 layers"),
    (["generate", "--prompt", "x", "--skip", "40"], "out of range"),
    (["generate", "--prompt", "x", "--variants", "full,turbo"], "unknown variant"),
    (["generate", "--prompt", "   "], "empty"),
    (["bench", "--lengths", "9000"], "exceeds the model's context"),
])
def test_errors_are_one_line_and_nonzero(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_module_entry_point_exits_nonzero_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "pop_analysis", "generate", "--model", "nope",
                           "--prompt", "x"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: unknown model 'nope': not a registry name (smollm2-135m, gemma3-270m), not a local "
        "directory and not a hub id of the form owner/name"]


ROOT = Path(__file__).resolve().parents[2]




def test_the_cli_refuses_in_one_line_with_exit_1(tmp_path):
    folder = saved(tmp_path, lambda t: t.pop("model.norm.weight"))
    proc = subprocess.run([sys.executable, "-m", "pop_analysis", "generate", "--model",
                           str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "model.norm.weight" in lines[0], lines
