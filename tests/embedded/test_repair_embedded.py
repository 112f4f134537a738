"""The K/V repair on the embedded model (held-out drift), and everywhere variants appear: the CLI
(repair, generate, drift, sweep), lm-eval's pop-hf and the sweeps."""
import json

import pytest
from lm_eval.api.instance import Instance

from pop_analysis import cli
from pop_analysis.commands import bench as bench_cmd
from pop_analysis.commands import drift as drift_cmd
from pop_analysis.commands import generate as generate_cmd
from pop_analysis.commands import repair as repair_cmd
from pop_analysis.engine.generate import encode
from pop_analysis.engine.models import model_from_hf
from pop_analysis.experiments.sweep import SweepConfig, ablation_sweep, cached_sweep
from pop_analysis.harness.lm_eval_model import PopLM, PopLMError
from pop_analysis.inspection.drift import DriftConfig, drift
from pop_analysis.quality.metrics import score_continuations
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import RepairConfig
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model

SKIP = (27, 28, 29)
CFG = RepairConfig(n_samples=48)  # ~1500 distinct tokens: enough for 576 features


@pytest.fixture(scope="module")
def fitted(embedded, tmp_path_factory):
    """One repair of layers 27-29 on 48 builtin prompts, in a temporary store."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POP_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        rep, stored = repair_store.fit_and_store(embedded, SKIP, CFG)
        assert not stored
        repair_store.attach(embedded, rep)
        yield rep
    embedded.adapter.kv_maps.clear()


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_repair_moves_held_out_kv_towards_the_full_model(embedded, fitted, shared_data):
    """On a GSM8K test question (never a calibration prompt) the repaired last layers' K and V
    sit closer to the full model's than plain POP's do."""
    question = json.loads((shared_data / "gsm8k_test.jsonl").open().readline())["question"]
    ids = encode(embedded, question)
    cfg = DriftConfig(decode_steps=2)
    pop, fixed = (drift(embedded, ids, RunSetting(SKIP, v), cfg) for v in ("pop", "pop_repair"))
    for i in SKIP[1:]:  # the first skipped layer's own projection is exact already
        assert fixed.v_cos[i] > pop.v_cos[i], (i, pop.v_cos[i], fixed.v_cos[i])
        assert fixed.k_cos[i] > pop.k_cos[i], (i, pop.k_cos[i], fixed.k_cos[i])
    assert fixed.variant == "pop_repair" and fixed.hidden_cos == pop.hidden_cos


def test_repair_fit_and_list_commands(embedded, fitted, monkeypatch, capsys):
    monkeypatch.setattr(repair_cmd, "load", lambda args: embedded)
    assert cli.main(["repair", "fit", "--skip", "27-29", "--samples", "48", "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    assert out["key"] == fitted.key and out["stored"] is True and out["skip_layers"] == list(SKIP)
    assert out["repair_bytes"] == 3 * 2 * (192 * 576 + 192) * 4 and out["share"] < 0.02
    assert set(out["fit"]) == {"27", "28", "29"} and out["fit"]["29"]["v_r2_loo"] > 0
    assert cli.main(["repair", "fit", "--skip", "27-29", "--samples", "48"]) == 0
    text = capsys.readouterr().out
    assert f"repair {fitted.key} (stored)" in text and "V R2 fit" in text
    assert cli.main(["repair", "list", "--json"]) == 0
    assert [r["key"] for r in last_json(capsys.readouterr().out)["repairs"]] == [fitted.key]


def test_generate_and_drift_take_a_repair(embedded, fitted, monkeypatch, capsys):
    monkeypatch.setattr(generate_cmd, "load", lambda args: embedded)
    monkeypatch.setattr(drift_cmd, "load", lambda args: embedded)
    assert cli.main(["generate", "--prompt", "What is 3+4?", "--skip", "27-29", "--max-new-tokens",
                     "4", "--repair", fitted.key, "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    assert set(out["runs"]) == {"full", "pop", "pop_repair"} and out["repair"] == fitted.key
    assert len(out["runs"]["pop_repair"]["token_ids"]) <= 4
    assert cli.main(["drift", "--prompt", "Explain photosynthesis.", "--skip", "27-29",
                     "--decode-steps", "2", "--no-cache", "--repair", "auto", "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    assert out["repair"] == fitted.key and out["pop_repair"]["v_cos"][29] > out["v_cos"][29]


def test_bench_times_pop_repair_against_pop(embedded, fitted, monkeypatch, capsys):
    monkeypatch.setattr(bench_cmd, "load", lambda args: embedded)
    assert cli.main(["bench", "--lengths", "16", "--repeats", "1", "--timing-budget", "0.1",
                     "--skip", "27-29", "--repair", fitted.key, "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    (row,) = out["rows"]
    r = row["pop_repair"]
    assert out["repair"] == fitted.key and r["timing_rounds"] >= 3
    assert r["ttft_ms"] > 0 and r["ttft_pop_ms"] > 0 and r["pop_over_repair"] > 0


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "x", "--variants", "pop_repair"], "needs --repair KEY"),
    (["generate", "--prompt", "x", "--skip", "20-29", "--repair", "KEY"], "fitted for skip set"),
    (["generate", "--prompt", "x", "--skip", "20-29", "--repair", "nope"], "no stored repair"),
    (["repair", "fit", "--skip", "3,5"], "contiguous block"),
    (["repair", "fit", "--skip", "27-29", "--samples", "8"], "needs at least 1154"),
])
def test_cli_errors_are_one_line(embedded, fitted, monkeypatch, capsys, argv, message):
    for mod in (generate_cmd, repair_cmd):
        monkeypatch.setattr(mod, "load", lambda args: embedded)
    argv = [fitted.key if a == "KEY" else a for a in argv]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_lm_eval_model_takes_repair(embedded, fitted):
    model = PopLM(lm=embedded, skip="27-29", variant="pop_repair", repair=fitted.key)
    ctx, cont = "The capital of France is", " Paris"
    (logprob, _), = model.loglikelihood([Instance("loglikelihood", {}, (ctx, cont), 0)])
    ctx_ids = embedded.tokenizer(ctx, add_special_tokens=False)["input_ids"]
    cont_ids = embedded.tokenizer(ctx + cont, add_special_tokens=False)["input_ids"][len(ctx_ids):]
    want = score_continuations(embedded, ctx_ids, [cont_ids], RunSetting(SKIP, "pop_repair"))[0]
    assert abs(logprob - want.total_logprob) < 1e-4
    with pytest.raises(PopLMError, match="needs repair=KEY"):
        PopLM(lm=embedded, skip="27-29", variant="pop_repair")
    with pytest.raises(PopLMError, match="variant=pop_repair only"):
        PopLM(lm=embedded, skip="27-29", repair=fitted.key)


@pytest.fixture(scope="module")
def tok_lm(embedded):
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer), max_position_embeddings=1024)
    return model_from_hf(tiny.model, embedded.tokenizer, name="tiny-tok")


def test_sweeps_add_pop_repair_rows(tok_lm, tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    fast = dict(n_samples=2, max_new_tokens=3, repeats=1, bench_tokens=16, repair="auto")
    res, _ = cached_sweep(tok_lm, "ratio", SweepConfig(ratios=(0, 0.5), **fast))
    assert [r["variant"] for r in res.rows] == ["full", "pop", "pop_repair"]
    assert res.rows[2]["skip_layers"] == [3, 4, 5] and res.rows[2]["prefill_speedup"] > 0
    (entry,) = repair_store.entries(tok_lm, (3, 4, 5))  # auto fitted one on the builtin prompts
    rows = ablation_sweep(tok_lm, SweepConfig(variants=("pop", "pop_repair"), **fast)).rows
    assert rows[1]["engine_variant"] == "pop_repair" and rows[1]["skip_layers"] == [4, 5]
    with pytest.raises(ValueError, match="rows need a repair"):
        ablation_sweep(tok_lm, SweepConfig(variants=("pop_repair",), **{**fast, "repair": None}))


def test_compare_and_summary_on_held_out_items(tok_lm):
    from pop_analysis.quality.evalsets import load_eval_set
    from pop_analysis.repair.evaluate import compare, summary
    from pop_analysis.repair.fit import Calibration, fit_repair

    seqs = [list(range(s, s + 40)) for s in range(0, 800, 40)]  # 800 distinct tokens
    rep = fit_repair(tok_lm, (4, 5), RepairConfig(data="ids"),
                     data=Calibration(seqs, "ids", "ids"))
    items = load_eval_set(tok_lm, "gsm8k", 3).items
    scores = compare(tok_lm, items, (4, 5), {"ids": rep})
    assert set(scores) == {"full", "pop", "ids"}
    out = summary(scores)
    assert out["ids"]["continuation_nll_delta"] is not None
    assert "continuation_nll_gap_closed" in out["ids"] and "next_token_kl_gap_closed" in out["ids"]
    assert "continuation_nll_gap_closed_note" in out["ids"]
    assert out["full"]["next_token_kl"] == 0.0
