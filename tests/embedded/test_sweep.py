"""Sweeps on a tiny model with the embedded tokenizer: schema, skip sets, cache, CLI, CSV."""
import csv
import json
import math

import pytest

from pop_analysis import cli
from pop_analysis.engine.models import model_from_hf
from pop_analysis.engine.skipset import preset
from pop_analysis.experiments.sweep import (
    PAPER_TABLES,
    SweepConfig,
    SweepError,
    SweepResult,
    ablation_sweep,
    adaptive_skip,
    adaptive_sweep,
    cached_sweep,
    length_sweep,
    list_sweeps,
    load_sweep,
    paper_frame,
    ratio_sweep,
    write_csv,
)

from tiny import tiny_model

SCHEMA = {"variant", "skip_ratio", "skip_layers", "prefill_speedup", "ideal_speedup",
          "continuation_nll", "greedy_agreement", "exact_match", "retrieval_acc",
          "speedup_range", "timing_rounds", "timing_trustworthy", "timing_note", "roofline_speedup"}
FAST = dict(n_samples=2, max_new_tokens=3, repeats=1, bench_tokens=16, timing_budget_s=0.05)


@pytest.fixture(scope="module")
def lm(embedded):
    """A 6-layer random llama that speaks the embedded tokenizer (so text data sets work)."""
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer), max_position_embeddings=1024)
    return model_from_hf(tiny.model, embedded.tokenizer, name="tiny-tok")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def ratio_result(lm):
    return ratio_sweep(lm, SweepConfig(dataset="gsm8k", ratios=(0, 0.5), **FAST))


def test_ratio_sweep_rows(ratio_result):
    res = ratio_result
    assert res.kind == "ratio" and len(res.rows) == 2
    full, pop = res.rows
    assert SCHEMA <= set(full)
    assert (full["variant"], full["skip_layers"], full["prefill_speedup"]) == ("full", [], 1.0)
    assert full["greedy_agreement"] == 1.0 and full["sequence_exact"] == 1.0
    assert pop["variant"] == "pop" and pop["skip_layers"] == [3, 4, 5] and pop["skip_ratio"] == 0.5
    assert pop["ideal_speedup"] > 1 and pop["prefill_speedup"] > 0 and pop["ttft_ms"] > 0
    lo, hi = pop["speedup_range"]
    assert lo <= pop["prefill_speedup"] <= hi and pop["timing_rounds"] >= 3
    assert pop["roofline_speedup"] > 0 and pop["timing_trustworthy"] == (pop["timing_note"] is None)
    assert (full["timing_rounds"], full["speedup_range"], full["timing_trustworthy"]) == \
        (0, [1.0, 1.0], True), "the full model is the reference, not timed"
    assert math.isfinite(pop["continuation_nll"]) and pop["n"] == 2
    assert pop["exact_match"] is None  # task accuracy is opt-in
    json.dumps(res.to_dict())  # JSON-able
    assert SweepResult.from_dict(res.to_dict()).rows == res.rows
    assert list(res.to_frame()["variant"]) == ["full", "pop"]


def test_ablation_sweep_uses_the_paper_presets(lm):
    cfg = SweepConfig(dataset="wizardlm", variants=("full", "shallow", "interleaved", "static"),
                      **FAST)
    rows = {r["variant"]: r for r in ablation_sweep(lm, cfg).rows}
    assert rows["shallow"]["skip_layers"] == list(preset("shallow", 6)) == [0, 1]
    assert rows["interleaved"]["skip_layers"] == [2, 5]
    assert rows["static"]["skip_layers"] == [4, 5] and rows["static"]["engine_variant"] == "static"
    assert rows["full"]["continuation_nll"] < rows["shallow"]["continuation_nll"]
    with pytest.raises(SweepError, match="unknown ablation"):
        ablation_sweep(lm, SweepConfig(variants=("pop", "magic"), **FAST))


def test_length_sweep_with_retrieval(lm):
    cfg = SweepConfig(lengths=(16, 160), **{**FAST, "n_samples": 1})
    res = length_sweep(lm, cfg)
    assert [(r["length"], r["variant"]) for r in res.rows] == [(16, "pop"), (160, "pop")]
    short, long = res.rows
    assert short["n"] == 0 and short["continuation_nll"] is None  # too short for the task (NaN)
    assert short["ideal_speedup"] > 1 and short["prefill_speedup"] > 0
    assert long["n"] == 1 and long["retrieval_acc"] in (0.0, 1.0)
    assert long["full_retrieval_acc"] in (0.0, 1.0) and long["full_continuation_nll"] > 0
    assert abs(long["item_tokens"] - 160) < 20


def test_adaptive_sweep_picks_lowest_prefill_scores(lm):
    scores = [5.0, 0.1, 4.0, 0.2, 3.0, 9.0]
    assert adaptive_skip(scores, 2) == (1, 3)
    res = adaptive_sweep(lm, SweepConfig(**FAST), {"prefill": scores})
    rows = {r["variant"]: r for r in res.rows}
    assert rows["adaptive"]["skip_layers"] == [1, 3] and rows["pop"]["skip_layers"] == [4, 5]
    with pytest.raises(SweepError, match="layers"):
        adaptive_sweep(lm, SweepConfig(**FAST), [1.0, 2.0])
    with pytest.raises(SweepError, match="prefill"):
        adaptive_sweep(lm, SweepConfig(**FAST), {"decode": scores})


def test_cached_sweep_hits_and_lists(lm, cache):
    cfg = SweepConfig(ratios=(0.5,), **FAST)
    first, hit1 = cached_sweep(lm, "ratio", cfg)
    again, hit2 = cached_sweep(lm, "ratio", cfg)
    assert (hit1, hit2) == (False, True) and again.rows == first.rows
    (entry,) = list_sweeps()
    assert entry["params"]["kind"] == "ratio"
    assert load_sweep(entry["key"]).rows == first.rows
    assert load_sweep("nope") is None
    with pytest.raises(SweepError, match="kind"):
        cached_sweep(lm, "sideways", cfg)


def test_csv_and_paper_tables(ratio_result, tmp_path):
    res = ratio_result
    path = tmp_path / "rows.csv"
    write_csv([res, res], path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 4 and rows[1]["skip_layers"] == "3-5" and rows[0]["model"] == "tiny-tok"
    t4 = PAPER_TABLES["table4"]
    assert len(t4["ratios"]) == len(t4["prefill_speedup"]) == len(t4["GSM8K"]) == 7
    assert paper_frame("table3").loc["pop", "GSM8K"] == 80.21
    assert list(paper_frame("table2").columns) == ["32", "128", "512", "2048"]


@pytest.fixture(scope="module")
def model_dir(lm, tmp_path_factory):
    d = tmp_path_factory.mktemp("tinymodel")
    lm.model.save_pretrained(d)
    lm.tokenizer.save_pretrained(d)
    return d


def test_cli_json_schema_and_csv(model_dir, cache, tmp_path, capsys):
    out_csv = tmp_path / "s.csv"
    code = cli.main(["sweep", "--model", str(model_dir), "--device", "cpu", "--samples", "1",
                     "--ratios", "0,0.5", "--variants", "full,interleaved", "--max-new-tokens", "2",
                     "--repeats", "1", "--bench-tokens", "16", "--json", "--csv", str(out_csv)])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["model"] == str(model_dir)
    assert [s["kind"] for s in out["sweeps"]] == ["ratio", "ablation"]
    assert [r["variant"] for r in out["rows"]] == ["full", "pop", "full", "interleaved"]
    for r in out["rows"]:
        assert SCHEMA <= set(r), set(r)
    assert len(list(csv.DictReader(out_csv.open()))) == 4


@pytest.mark.parametrize("argv, message, exit_code", [
    (["--ratios", "0,abc"], "argument --ratios: each value must be a finite number", 2),
    (["--ratios", "0.5", "--dataset", "missing.jsonl"], "not found", 1),
    (["--kind", "adaptive"], "--calibration", 1),
    (["--lengths", "0"], "argument --lengths: each value must be a whole number in 1..", 2),
])
def test_cli_errors_are_one_line(model_dir, cache, capsys, argv, message, exit_code):
    try:
        code = cli.main(["sweep", "--model", str(model_dir), "--device", "cpu", *argv])
    except SystemExit as e:  # a flag's value refused while the flags are parsed
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == exit_code and message in err and len(err.splitlines()) == 1, err


def test_bad_calibration_file(model_dir, cache, tmp_path, capsys):
    bad = tmp_path / "cal.json"
    bad.write_text("{oops")
    code = cli.main(["sweep", "--model", str(model_dir), "--calibration", str(bad)])
    assert code == 1 and "not valid JSON" in capsys.readouterr().err


QUALITY = ("continuation_nll", "next_token_kl", "next_token_top1", "teacher_forced_top1",
           "greedy_agreement", "sequence_exact")


def check_row_contract(row: dict) -> None:
    """n, M_ci for every quality metric present, M_delta and M_delta_ci for variants but full."""
    assert row["n"] >= 2, row
    for m in QUALITY + ("exact_match", "retrieval_acc"):
        if row.get(m) is None:
            continue
        lo, hi = row[f"{m}_ci"]
        assert lo <= row[m] <= hi, (m, row[m], row[f"{m}_ci"])
        if row["variant"] == "full":
            assert row.get(f"{m}_delta") is None
            continue
        dlo, dhi = row[f"{m}_delta_ci"]
        assert dlo <= row[f"{m}_delta"] <= dhi, (m, row[f"{m}_delta"], row[f"{m}_delta_ci"])


def test_rows_carry_n_intervals_and_paired_deltas(ratio_result):
    full, pop = ratio_result.rows
    for row in (full, pop):
        check_row_contract(row)
        assert set(QUALITY) <= set(row)
    assert full["next_token_kl"] == 0.0 and full["next_token_top1"] == 1.0
    assert pop["next_token_kl"] > 0 and pop["next_token_kl_delta"] == pop["next_token_kl"]
    assert pop["continuation_nll_delta"] == pytest.approx(
        pop["continuation_nll"] - full["continuation_nll"])
    assert pop["full_continuation_nll"] == full["continuation_nll"]
    assert ratio_result.notes == []


def test_retrieval_rows_carry_the_full_models_score(lm):
    res = ablation_sweep(lm, SweepConfig(dataset="retrieval:160", variants=("pop", "static"),
                                         **{**FAST, "max_new_tokens": 6}))
    full_acc = {r["full_retrieval_acc"] for r in res.rows}
    assert len(full_acc) == 1 and None not in full_acc  # the same full model on the same items
    for row in res.rows:
        check_row_contract(row)
        assert row["retrieval_acc"] is not None and len(row["retrieval_acc_ci"]) == 2
        assert row["full_retrieval_acc_ci"][0] <= row["full_retrieval_acc"]
        assert row["retrieval_acc_delta_p"] is not None


def test_cli_refuses_too_many_items_and_notes_too_few(model_dir, cache, tmp_path, capsys):
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Count to {i}"}) + "\n" for i in range(3)))
    out_csv = tmp_path / "rows.csv"
    flags = ["--ratios", "0,0.5", "--max-new-tokens", "2", "--repeats", "1", "--bench-tokens", "16",
             "--json", "--csv", str(out_csv)]
    code = cli.main(["sweep", "--model", str(model_dir), "--device", "cpu", "--dataset", str(data),
                     "--samples", "50", *flags])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and err == [f"error: {data} holds 3 items, fewer than the 50 asked for by "
                                 "--samples; ask for at most 3"], err
    code = cli.main(["sweep", "--model", str(model_dir), "--device", "cpu", "--dataset", str(data),
                     "--samples", "3", *flags])
    captured = capsys.readouterr()
    assert code == 0
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert [r["n"] for r in out["rows"]] == [3, 3]
    for row in out["rows"]:
        check_row_contract(row)
    header = next(csv.reader(out_csv.open()))
    assert {"n", "continuation_nll_ci", "continuation_nll_delta", "continuation_nll_delta_ci"} <= set(header)
    code = cli.main(["sweep", "--model", str(model_dir), "--device", "cpu", "--dataset", str(data),
                     "--samples", "1", "--ratios", "0.5", "--max-new-tokens", "2", "--repeats", "1",
                     "--bench-tokens", "16", "--json"])
    captured = capsys.readouterr()
    assert code == 0 and "n = 1: no 95% intervals" in captured.err
    (row,) = json.loads(captured.out.strip().splitlines()[-1])["rows"]
    assert row["n"] == 1 and row["continuation_nll_ci"] is None and row["continuation_nll"] > 0
