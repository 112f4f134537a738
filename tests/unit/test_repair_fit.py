"""The closed-form K/V repair: invariants on tiny random models, the store, refusals, counters."""
import pytest
import torch
from test_families import build

from pop_analysis.engine.counters import count_calls
from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.pop import RepairError, run_prompt
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import (
    Calibration,
    RepairConfig,
    RepairDataError,
    collect,
    distinct_positions,
    fit,
    fit_repair,
    min_tokens,
)
from pop_analysis.repair.store import attach, check_compatible, load, save
from pop_analysis.store.schema import plain
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

SKIP = (4, 5)
GREEDY = SamplingConfig(max_new_tokens=6, stop_at_eos=False)


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    return tmp_path


def sequences(n=30, length=20):
    return [tiny_prompt(length, seed=s) for s in range(n)]


def own_weights(adapter, skip):
    """The layers' own projections as 'fitted' maps: the identity repair."""
    def wb(p):
        return p.weight.detach(), (p.bias.detach() if p.bias is not None
                                   else torch.zeros(p.weight.shape[0]))
    return {i: (*wb(adapter.k_proj(i)), *wb(adapter.v_proj(i))) for i in skip}


def random_repair(lm, skip=SKIP, n=30):
    data = Calibration(sequences(n), "random", f"random-{n}")
    return fit_repair(lm, skip, RepairConfig(data="random"), data=data)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_identity_maps_equal_pop_exactly(family):
    lm = tiny_model(family)
    lm.adapter.register_kv_maps(SKIP, own_weights(lm.adapter, SKIP), "identity")
    ids = torch.tensor([tiny_prompt(15)])
    pop, rep = (run_prompt(lm.adapter, ids, RunSetting(SKIP, v)) for v in ("pop", "pop_repair"))
    assert torch.equal(pop.logits, rep.logits), (pop.logits - rep.logits).abs().max()
    for i in SKIP:
        for a, b in zip(lm.adapter.cached_kv(pop.cache, i), lm.adapter.cached_kv(rep.cache, i)):
            assert torch.equal(a, b), f"layer {i}: max_diff {(a - b).abs().max()}"
    assert (run(lm, tiny_prompt(15), RunSetting(SKIP), GREEDY).token_ids
            == run(lm, tiny_prompt(15), RunSetting(SKIP, "pop_repair"), GREEDY).token_ids)


def test_fit_recovers_projections_when_skipped_layers_are_identity_layers():
    """Zero o_proj and down_proj of layers 3 and 4: layers 4 and 5 then receive x_3 unchanged,
    so the best map from LN_l(x_3) to their true K/V is their own projection."""
    lm = tiny_model("qwen2")  # k/v projections with a bias
    a, skip = lm.adapter, (3, 4, 5)
    with torch.no_grad():
        for i in (3, 4):
            a.o_proj(i).weight.zero_()
            a.ffn(i).down_proj.weight.zero_()
    fits = fit(lm, collect(lm, sequences(), skip), skip)
    for i in (4, 5):
        for name, proj in (("k", a.k_proj(i)), ("v", a.v_proj(i))):
            f = fits[i][name]
            w_err = (f.weight - proj.weight).abs().max().item()
            b_err = (f.bias - proj.bias).abs().max().item()
            assert w_err < 1e-4 and b_err < 1e-4, f"layer {i} {name}: max_diff {w_err}, {b_err}"
            assert f.r2_loo > 0.999999


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gemma3_text"])
def test_fitted_map_shapes_match_each_family(name):
    lm = build(name)
    rep = random_repair(lm)
    for i in SKIP:
        for n, proj in (("k", lm.adapter.k_proj(i)), ("v", lm.adapter.v_proj(i))):
            assert rep.tensors[f"{i}.{n}.weight"].shape == proj.weight.shape
            assert rep.tensors[f"{i}.{n}.bias"].shape == (proj.weight.shape[0],)
    attach(lm, rep, SKIP)
    ids = torch.tensor([tiny_prompt(15)])
    pop, fixed = (run_prompt(lm.adapter, ids, RunSetting(SKIP, v)) for v in ("pop", "pop_repair"))
    assert torch.isfinite(fixed.logits).all()
    k_pop, k_fix = (lm.adapter.cached_kv(r.cache, SKIP[-1])[0] for r in (pop, fixed))
    assert not torch.equal(k_pop, k_fix), "the last skipped layer's keys must come from its map"


def test_store_round_trip_and_listing(tmp_store):
    lm = tiny_model("llama")
    rep = save(random_repair(lm))
    back = load(rep.key)
    assert back.skip == rep.skip and back.model == rep.model and back.config == rep.config
    assert back.info == plain(rep.info)
    assert set(back.tensors) == set(rep.tensors)
    for k, t in rep.tensors.items():
        assert torch.equal(back.tensors[k], t), k
    assert [e["key"] for e in repair_store.entries(lm, SKIP)] == [rep.key]
    assert repair_store.entries(lm, (3, 4, 5)) == []
    assert (tmp_store / "results" / "repair" / f"{rep.key}.safetensors").is_file()
    mem = repair_store.memory(lm, back)
    assert mem["repair_bytes"] == 2 * 2 * (32 * 64 + 32) * 4 and mem["model_bytes"] > 0
    row, = repair_store.listing(lm, SKIP)  # what the CLI list and the Skip set page show
    assert row["key"] == rep.key and row["skip"] == list(SKIP) and row["data"] == "random"
    assert row["repair_bytes"] == mem["repair_bytes"] == back.nbytes()
    fit5 = rep.info["fit"]["5"]
    assert row["last_layer_r2"]["v"] == (fit5["v_r2_pop"], fit5["v_r2_loo"])
    assert repair_store.listing(lm, (3, 4, 5)) == []


def test_missing_or_damaged_repairs_are_one_line(tmp_store):
    from safetensors.torch import save_file

    lm = tiny_model("llama")
    rep = save(random_repair(lm))
    for key in ("../../etc/passwd", "0123456789abcdef0000"):
        with pytest.raises(RepairError, match="no stored repair"):
            load(key)
    path = tmp_store / "results" / "repair" / f"{rep.key}.safetensors"
    save_file({k: v for k, v in rep.tensors.items() if not k.startswith("5.")}, str(path))
    with pytest.raises(RepairError, match="unreadable .*do not cover skip set 4-5") as e:
        load(rep.key)
    assert "\n" not in str(e.value)
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(RepairError, match="unreadable"):
        load(rep.key)


def test_ensure_auto_reuses_the_stored_repair(tmp_store, monkeypatch):
    lm = tiny_model("llama")
    rep = save(random_repair(lm))
    monkeypatch.setattr(repair_store, "fit_and_store", lambda *a, **k: pytest.fail("refitted"))
    assert repair_store.ensure(lm, SKIP, "auto").key == rep.key
    assert lm.adapter.kv_maps[SKIP].tag == rep.key


def test_other_skip_set_or_model_refused_in_one_line():
    lm = tiny_model("llama")
    rep = random_repair(lm)
    with pytest.raises(RepairError, match=r"fitted for skip set 4-5, not 3-5") as e:
        attach(lm, rep, (3, 4, 5))
    assert "\n" not in str(e.value)
    other = tiny_model("llama", seed=1)
    with pytest.raises(RepairError, match="fitted for model tiny-llama") as e:
        check_compatible(other, rep)
    assert "\n" not in str(e.value)
    attach(lm, rep, SKIP)
    with pytest.raises(RepairError, match="needs a repair fitted for skip set 3-5") as e:
        run_prompt(lm.adapter, torch.tensor([tiny_prompt(8)]), RunSetting((3, 4, 5), "pop_repair"))
    assert "registered: 4-5" in str(e.value) and "\n" not in str(e.value)


def test_no_repair_registered_is_one_line():
    lm = tiny_model("llama")
    with pytest.raises(RepairError, match=r"pop_repair needs a repair .* \(registered: none\)"):
        run(lm, tiny_prompt(8), RunSetting(SKIP, "pop_repair"), GREEDY)


def test_too_few_tokens_says_how_many_are_needed():
    lm = tiny_model("llama")
    need = min_tokens(64)
    acts = collect(lm, sequences(n=4, length=10), SKIP)
    with pytest.raises(RepairDataError, match=rf"{acts.n_tokens} distinct.*at least {need}"):
        fit(lm, acts, SKIP)


def test_non_contiguous_or_empty_skip_refused():
    lm = tiny_model("llama")
    with pytest.raises(RepairError, match="contiguous block"):
        collect(lm, sequences(2), (2, 4))
    with pytest.raises(RepairError, match="empty"):
        collect(lm, sequences(2), ())


def test_counters_match_pop():
    lm = tiny_model("llama")
    attach(lm, random_repair(lm), SKIP)
    counts = {}
    for v in ("pop", "pop_repair"):
        with count_calls(lm.adapter) as c:
            run(lm, tiny_prompt(12), RunSetting(SKIP, v), GREEDY, counts=c)
        counts[v] = c.as_dict()
    assert counts["pop"] == counts["pop_repair"]
    assert counts["pop"]["prefill"]["k_proj"][5] == 1 and counts["pop"]["prefill"]["ffn"][5] == 0


def test_fitted_maps_run_in_the_pruned_prefill_only():
    """x_N (boundary) and decode use the layers' own projections, never the fitted ones."""
    lm = tiny_model("llama")
    attach(lm, random_repair(lm), SKIP)
    with count_calls(lm.adapter) as c:
        seen = []
        hooks = [m.register_forward_hook(lambda *_: seen.append(c.stage))
                 for i in SKIP for m in lm.adapter.kv_maps[SKIP].maps[i]]
        try:
            run(lm, tiny_prompt(12), RunSetting(SKIP, "pop_repair"), GREEDY, counts=c)
        finally:
            for h in hooks:
                h.remove()
    assert seen == ["prefill"] * 4  # k and v of layers 4 and 5, once each
    assert c.as_dict()["decode"]["k_proj"][5] == GREEDY.max_new_tokens - 1


def test_shared_prefixes_are_counted_once_with_their_multiplicity():
    starts, weights = distinct_positions([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6], [7]])
    assert starts == [0, 2, 3, 0]
    assert weights == [[3, 3, 2, 1], [1], [1], [1]]
    lm = tiny_model("llama")
    acts = collect(lm, [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6]], SKIP)
    assert acts.n_tokens == 6 and sorted(acts.weight.tolist()) == [1, 1, 1, 2, 3, 3]


def test_batched_collection_equals_one_sequence_at_a_time():
    """Left padding in a batch leaves every recorded row as the sequence alone gives it."""
    lm = tiny_model("llama")
    seqs = [tiny_prompt(n, seed=n) for n in (5, 9, 14, 20)]
    one, batched = (collect(lm, seqs, SKIP, batch_size=b) for b in (1, 16))
    assert torch.equal(one.weight, batched.weight)
    for a, b in [(one.x, batched.x), *((one.k[i], batched.k[i]) for i in SKIP),
                 *((one.v[i], batched.v[i]) for i in SKIP)]:
        assert torch.allclose(a, b, atol=1e-5), f"max_diff {(a - b).abs().max()}"


def test_gap_closed_share_and_interval():
    from pop_analysis.quality.stats import StatsError
    from pop_analysis.repair.evaluate import gap_closed

    g = torch.Generator().manual_seed(0)
    full = (1 + torch.rand(40, generator=g)).tolist()
    gap = (0.2 + 0.1 * torch.rand(40, generator=g)).tolist()
    pop = [f + d for f, d in zip(full, gap)]
    fixed = [f + 0.25 * d for f, d in zip(full, gap)]  # a quarter of each item's gap remains
    est = gap_closed(full, pop, fixed)
    assert est.n == 40 and abs(est.value - 0.75) < 1e-12 and est.includes(0.75)
    assert gap_closed(full, pop, pop).value == 0.0
    worse = gap_closed(full, pop, [p + 0.1 for p in pop])
    assert worse.value < 0 and worse.ci[1] < 0
    with pytest.raises(StatsError, match="no gap"):
        gap_closed(full, full, full)
    with pytest.raises(StatsError, match="at least 2"):
        gap_closed(full[:1], pop[:1], fixed[:1])
