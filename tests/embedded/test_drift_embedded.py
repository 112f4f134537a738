"""Drift of the embedded model on GSM8K and by length, and the CLI's JSON schema."""
import json

from pop_analysis import cli
from pop_analysis.inspection.drift import (
    DriftConfig,
    drift,
)
from pop_analysis.inspection.drift_length import drift_by_length, length_prompts
from pop_vllm.run_setting import RunSetting

QS = ("hidden", "k", "v", "attn_out")


def worst(values) -> float:
    return max(abs(1.0 - x) for x in values)


def test_embedded_gsm8k_drift_and_by_length(embedded, shared_data, tmp_results):
    """SmolLM2-135M, skip 20-29, one GSM8K question: drift confined to the block and after it."""
    from pop_analysis.engine.generate import encode

    question = json.loads((shared_data / "gsm8k_test.jsonl").open().readline())["question"]
    r = drift(embedded, encode(embedded, question), RunSetting(range(20, 30)),
              DriftConfig(decode_steps=3))
    for q in QS:
        d = worst(getattr(r, f"{q}_min")[:20])
        assert d < 1e-5, f"{q} before the block departs from 1 by {d}"
    assert worst(r.k_min[20:21] + r.v_min[20:21]) < 1e-5
    means = r.block_means()
    assert 0.2 < means["v_cos"] < 0.97 and 0.2 < means["hidden_cos"] < 0.97, means
    assert r.v_cos[29] < r.v_cos[21], r.v_cos  # V drift grows through the block
    assert r.tokens and len(r.tokens) == len(r.hidden_tok[0])
    prompts, repeated = length_prompts(embedded, [16, 48], ["a b c d e f g h"])
    assert [len(p) for p in prompts] == [16, 48] and repeated
    rows = drift_by_length(embedded, [16, 48], RunSetting(range(20, 30)),
                           DriftConfig(decode_steps=2),
                           text_source=str(shared_data / "gsm8k_test.jsonl"))
    assert [row["length"] for row in rows] == [16, 48] and not rows[0]["repeated"]
    for row in rows:
        assert set(row) >= {"hidden_cos", "k_cos", "v_cos", "attn_out_cos", "kl", "top1_agree"}
        assert 0.0 < row["v_cos"] < 1.0 and row["kl"] >= 0.0


def test_cli_json_schema(embedded, capsys, tmp_results):
    code = cli.main(["drift", "--prompt", "What is 3 + 4?", "--skip", "24-29", "--decode-steps",
                     "2", "--lengths", "12,20", "--threads", "2", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out.strip().splitlines()[-1])
    L = embedded.adapter.n_layers
    assert out["model"] == "smollm2-135m" and out["skip_layers"] == list(range(24, 30))
    for key in ("hidden_cos", "k_cos", "v_cos", "attn_out_cos"):
        assert len(out[key]) == L and all(-1.0 <= x <= 1.0 for x in out[key]), key
    assert len(out["kl"]) == len(out["top1_agree"]) == 2
    assert [row["length"] for row in out["by_length"]] == [12, 20]
    assert "[" in captured.err  # the progress bar goes to stderr, stdout stays JSON
