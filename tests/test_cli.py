"""The CLI: JSON schemas, one-line errors, non-zero exits."""
import json
import subprocess
import sys

import pytest

from pop_analysis.cli import main
from tiny import tiny_model

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_generate_json_schema(capsys):
    rc = main(["generate", "--prompt", "What is 3+4?", "--max-new-tokens", "6",
               "--variants", "full,pop,static", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert set(out) >= {"model", "n_layers", "skip_layers", "prompt_tokens", "runs", "prefill_speedup"}
    assert out["skip_layers"] == list(range(20, 30)) and out["n_layers"] == 30
    for v in ("full", "pop", "static"):
        run = out["runs"][v]
        assert set(run) >= {"text", "token_ids", "ttft_ms", "decode_tokens_per_s"}
        assert len(run["token_ids"]) <= 6 and run["ttft_ms"] > 0 and isinstance(run["text"], str)
    assert out["prefill_speedup"] == pytest.approx(
        out["runs"]["full"]["ttft_ms"] / out["runs"]["pop"]["ttft_ms"], rel=1e-3)


def test_generate_prompt_ids_on_model_without_tokenizer(tmp_path, capsys):
    tiny_model("qwen3").model.save_pretrained(tmp_path)
    rc = main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2,3,4", "--skip", "4-5",
               "--max-new-tokens", "3", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert out["runs"]["pop"]["text"] is None and len(out["runs"]["pop"]["token_ids"]) == 3
    assert out["skip_layers"] == [4, 5]


def test_bench_json_schema(capsys):
    rc = main(["bench", "--lengths", "16,48", "--repeats", "1", "--threads", "2", "--json"])
    assert rc == 0
    out = last_json(capsys.readouterr().out)
    assert out["threads"] == 2 and out["skip_layers"] == list(range(20, 30))
    assert [r["length"] for r in out["rows"]] == [16, 48]
    for r in out["rows"]:
        assert r["ttft_full_ms"] > 0 and r["ttft_pop_ms"] > 0 and r["ideal_speedup"] > 1


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "nope", "--prompt", "x"], "unknown model 'nope'"),
    (["generate", "--prompt", "x", "--skip", "0-29"], "cannot skip all 30 layers"),
    (["generate", "--prompt", "x", "--skip", "40"], "out of range"),
    (["generate", "--prompt", "x", "--variants", "full,turbo"], "unknown variant"),
    (["generate", "--prompt-ids", "1,a"], "comma-separated integers"),
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
        "error: unknown model 'nope': not a registry name (smollm2-135m), not a local directory "
        "and not a hub id of the form owner/name"]
