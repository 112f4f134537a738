"""Repairs stored like every other result (issue 22, item 4 and part of 5): a fit whose store write
fails prints its result with one warning (exit 0); `repair list` shows only usable repairs;
`--repair auto` refits when the newest is unusable; loaded maps are checked for shape (both shapes
named) and for a sane scale against the layer's own projection."""
import json
import warnings

import pytest
import torch

from pop_analysis import cli
from pop_analysis.commands import repair as repair_cmd
from pop_analysis.engine.pop import RepairError
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import Calibration, RepairConfig, fit_repair
from pop_analysis.store.results import StoreWarning

from tiny import tiny_model, tiny_prompt

SKIP = (4, 5)


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def random_data(monkeypatch):
    """Calibration on random token sequences (the tiny models have no tokenizer)."""
    data = Calibration([tiny_prompt(20, seed=s) for s in range(30)], "random", "random-30")
    monkeypatch.setattr(repair_store, "calibration", lambda lm, cfg: data)
    return data


def maps_file(store, key):
    return store / "results" / "repair" / f"{key}.safetensors"


def test_a_fit_whose_store_cannot_be_written_warns_and_keeps_its_result(tmp_path, monkeypatch,
                                                                          random_data):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "file" / "cache"))  # not a folder
    lm = tiny_model("llama")
    with pytest.warns(StoreWarning, match="not stored"):
        rep, stored = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    assert not stored and rep.skip == SKIP and set(rep.tensors) == {
        f"{i}.{n}.{p}" for i in SKIP for n in "kv" for p in ("weight", "bias")}
    with pytest.warns(StoreWarning):
        assert repair_store.ensure(lm, SKIP, "auto").skip == SKIP  # attached all the same
    assert lm.adapter.kv_maps[SKIP].maps


def test_repair_fit_command_prints_the_result_and_one_warning(tmp_path, monkeypatch, capsys,
                                                              random_data):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "file" / "cache"))
    lm = tiny_model("llama")
    monkeypatch.setattr(repair_cmd, "load", lambda args: lm)
    assert cli.main(["repair", "fit", "--skip", "4-5", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1])["stored"] is False
    warned = [line for line in out.err.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and "not stored" in warned[0], out.err


def test_repair_list_leaves_out_a_repair_whose_maps_are_gone(tmp_store, random_data, capsys):
    lm = tiny_model("llama")
    good, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    gone, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random", max_tokens=500))
    maps_file(tmp_store, gone.key).unlink()
    with pytest.warns(StoreWarning, match=f"repair {gone.key}.*not listed"):
        rows = repair_store.listing()
    assert [r["key"] for r in rows] == [good.key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["repair", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["repairs"]
    assert [r["key"] for r in listed] == [good.key]


def test_repair_auto_refits_when_the_newest_is_unusable(tmp_store, random_data):
    lm = tiny_model("llama")
    old, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    maps_file(tmp_store, old.key).write_bytes(b"damaged")
    with pytest.warns(StoreWarning, match=f"repair {old.key}"):
        rep = repair_store.ensure(lm, SKIP, "auto")
    assert lm.adapter.kv_maps[SKIP].tag == rep.key
    assert repair_store.load(rep.key).skip == SKIP  # the refit was stored again


def test_a_bias_of_the_wrong_shape_names_both_shapes():
    lm = tiny_model("llama")
    data = Calibration([tiny_prompt(20, seed=s) for s in range(30)], "random", "random-30")
    rep = fit_repair(lm, SKIP, RepairConfig(data="random"), data=data)
    rep.tensors["5.v.bias"] = torch.zeros(31)  # the projection's output is 32 wide
    with pytest.raises(RepairError) as e:
        repair_store.attach(lm, rep)
    assert "(31,)" in str(e.value) and "(32,)" in str(e.value), str(e.value)


def test_maps_of_an_absurd_scale_are_refused(tmp_store, random_data):
    from safetensors.torch import load_file, save_file

    lm = tiny_model("llama")
    rep, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    path = maps_file(tmp_store, rep.key)
    tensors = {k: v * (1e30 if k == "5.k.weight" else 1.0) for k, v in load_file(path).items()}
    save_file(tensors, str(path))
    with pytest.raises(RepairError, match=r"map 5\.k .* times the layer's own projection"):
        repair_store.attach(lm, repair_store.load(rep.key))


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.to(torch.int8), r"map 5\.k\.weight is stored as int8, not a float type"),
    (lambda t: t.index_fill(0, torch.tensor([0]), float("nan")),
     r"map 5\.k\.weight holds \d+ values? that (is|are) not finite"),
])
def test_maps_that_are_not_numbers_are_refused(tmp_store, random_data, edit, why):
    from safetensors.torch import load_file, save_file

    lm = tiny_model("llama")
    rep, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    path = maps_file(tmp_store, rep.key)
    tensors = {k: edit(v) if k == "5.k.weight" else v for k, v in load_file(path).items()}
    save_file(tensors, str(path))
    with pytest.raises(RepairError, match=why) as e:
        repair_store.load(rep.key)
    assert "\n" not in str(e.value)


def test_half_precision_maps_load_upcast(tmp_store, random_data):
    from safetensors.torch import load_file, save_file

    lm = tiny_model("llama")
    rep, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    path = maps_file(tmp_store, rep.key)
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(path).items()}, str(path))
    repair_store.attach(lm, repair_store.load(rep.key))
    assert lm.adapter.kv_maps[SKIP].maps


def test_the_engines_maps_file_comes_from_the_store_without_a_model(tmp_store, random_data,
                                                                    tmp_path):
    """serve --repair KEY|auto finds the file from the store and the checkpoint's K/V weights
    alone (no model built); a repair for another skip set or checkpoint is refused in one line."""
    from pop_analysis.repair.fit import checkpoint_fingerprint, model_identity

    lm, other = tiny_model("llama"), tiny_model("llama", seed=7)
    folder, elsewhere = tmp_path / "llama", tmp_path / "other"
    lm.model.save_pretrained(folder)
    other.model.save_pretrained(elsewhere)
    n = lm.adapter.n_layers
    assert checkpoint_fingerprint(folder, n) == model_identity(lm)["fingerprint"]
    assert repair_store.stored_maps_file(folder, n, SKIP, "auto") is None  # none stored yet
    rep, _ = repair_store.fit_and_store(lm, SKIP, RepairConfig(data="random"))
    want = str(maps_file(tmp_store, rep.key).resolve())
    assert repair_store.stored_maps_file(folder, n, SKIP, "auto") == want
    assert repair_store.stored_maps_file(folder, n, SKIP, rep.key) == want
    assert repair_store.stored_maps_file(folder, n, (3, 4, 5), "auto") is None
    for directory, skip, words in ((folder, (3, 4, 5), "fitted for skip set 4-5, not 3-5"),
                                   (elsewhere, SKIP, "another checkpoint than other")):
        with pytest.raises(RepairError, match=words) as e:
            repair_store.stored_maps_file(directory, n, skip, rep.key)
        assert "\n" not in str(e.value)
    with pytest.raises(RepairError, match="no stored repair 'nope'"):
        repair_store.stored_maps_file(folder, n, SKIP, "nope")
