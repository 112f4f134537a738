"""Importance methods on the embedded SmolLM2: a short real run of every method (stored and
reloaded), and the `importance` and `choose` commands (JSON, the store, one-line errors)."""
import json
import math

import pytest

from pop_analysis.cli import main
from pop_analysis.data.prompts import load_prompts
from pop_analysis.experiments.methods_run import (KIND, PART_KIND, ImportanceConfig,
    cached_importance, list_importance, load_importance)
from pop_analysis.store import results as store

from cli_lines import last_error_line, one_error_line


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_a_short_real_run_of_every_method_is_stored_and_reloaded(embedded, tmp_results):
    prompts = load_prompts("builtin")
    cfg = ImportanceConfig(n_samples=2, new_tokens=4, resamples=100)
    res, hit = cached_importance(embedded, prompts, cfg)
    assert not hit and res.n_layers == 30 and res.n_samples == 2
    assert set(res.stored.values()) == {"computed"} and set(res.seconds) == {"gate", "hooks", "dropone"}
    for key, values in res.series.items():
        assert len(values) == 30 and all(math.isfinite(v) for v in values), key
        if key.split(".")[0] in ("bi", "angular", "sublayer", "magnitude", "gate", "taylor"):
            assert min(values) >= 0, key
    # POP's prefill never reads the last layer's prompt outputs: skipping it changes nothing
    assert res.series["gate.prefill"][29] == 0.0
    assert abs(res.series["dropone.nll"][29]) < 1e-4 and res.series["dropone.kl"][29] < 1e-4
    assert max(res.series["dropone.nll"]) > 0.01
    assert len(res.triangle) == 30 and [len(r) for r in res.triangle] == list(range(30, 0, -1))
    assert res.series["angular.last"] == pytest.approx([row[0] for row in res.triangle])
    names = res.agreement["names"]
    i = names.index("dropone.nll")
    assert res.agreement["kendall"][i][i] == pytest.approx(1.0)
    again, hit = cached_importance(embedded, prompts, cfg)
    assert hit and again == res
    assert len(store.entries(PART_KIND)) == 2 and len(list_importance()) == 1
    assert load_importance(list_importance()[0]["key"], 30) == res
    only_bi, hit = cached_importance(embedded, prompts, ImportanceConfig(methods=("bi", "tail"),
                                                                         n_samples=2, new_tokens=4))
    assert not hit and only_bi.stored == {"hooks": "stored"} and only_bi.seconds == {"hooks": 0.0}
    assert only_bi.series["bi.prefill"] == res.series["bi.prefill"]
    assert len(store.entries(KIND)) == 2


def test_importance_and_choose_commands(embedded, tmp_results, monkeypatch, capsys):
    import pop_analysis.commands.choose as choose_cmd
    import pop_analysis.commands.importance as importance_cmd

    for mod in (choose_cmd, importance_cmd):
        monkeypatch.setattr(mod, "load", lambda args: embedded)
    args = ["importance", "--methods", "bi,angular,tail", "--samples", "2", "--json"]
    assert main(args) == 0
    out = last_json(capsys.readouterr().out)
    assert set(out["scores"]) == {"bi", "angular", "tail"} and not out["cached"]
    assert set(out["scores"]["bi"]) == {"prefill", "decode"} and len(out["scores"]["bi"]["prefill"]) == 30
    assert out["primary"] == {"bi": "bi.prefill", "angular": "angular.last", "tail": "tail.depth"}
    assert main(args) == 0 and last_json(capsys.readouterr().out)["cached"]
    choose_args = ["choose", "--method", "bi", "--samples", "2", "--eval-samples", "3",
                   "--answer-tokens", "8", "--no-speed", "--max-candidates", "3", "--json"]
    assert main([*choose_args, "--max-delta-nll", "20"]) == 0
    got = last_json(capsys.readouterr().out)
    assert got["met"] and len(got["skip_layers"]) >= 8 and len(got["candidates"]) == 3
    assert all(set(c) >= {"k", "skip_layers", "continuation_nll_delta_ci", "meets"} for c in got["candidates"])
    assert got["ideal_speedup"] > 1 and got["prefill_speedup"] is None  # --no-speed
    assert main([*choose_args, "--min-top1", "1.0", "--probes", "1"]) == 1
    err = last_error_line(capsys)
    assert err.startswith("error: no skip set meets top-1 agreement lower bound >= 100%")
    assert "the best found: layers" in err


@pytest.mark.parametrize("argv, message, code", [
    (["importance", "--methods", "gate,nope"], "unknown method 'nope'", 1),
    (["importance", "--samples", "0"], "--samples: must be a whole number in 1..", 2),  # the flag
    (["importance", "--compare", "--budgets", "0.2,1.5"], "in (0, 1)", 2),  # the flag
    (["choose"], "give a budget", 1),
    (["choose", "--max-delta-nll", "0.1", "--method", "nope"], "unknown method", 1),
    (["choose", "--min-top1", "nan"], "--min-top1: must be a finite number in [0, 1]", 2),
])
def test_bad_input_is_one_line_before_any_model_work(argv, message, code, capsys, monkeypatch):
    import pop_analysis.commands.choose as choose_cmd
    import pop_analysis.commands.importance as importance_cmd

    def refuse(args):
        raise AssertionError("the model was loaded before the input was checked")

    for mod in (choose_cmd, importance_cmd):
        monkeypatch.setattr(mod, "load", refuse)
    try:
        got = main(argv)
    except SystemExit as e:  # a flag's own check (argparse): exit 2
        got = e.code
    assert got == code
    assert message in one_error_line(capsys)
