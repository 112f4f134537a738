"""Drift invariants on tiny random models: identity at an empty skip set, where drift starts, hooks removed, shapes, cache round trip, bad input."""
import json

import pytest
import torch

from pop_analysis import cli
from pop_analysis.inspection import drift as drift_mod
from pop_analysis.inspection.drift import (
    DriftConfig,
    DriftError,
    DriftResult,
    average,
    cached_drift,
    cosine,
    drift,
    kl_full_pop,
)
from pop_analysis.inspection.drift_length import drift_by_length
from pop_vllm.run_setting import RunSetting, SettingError

from tiny import FAMILIES, tiny_model, tiny_prompt

CFG = DriftConfig(decode_steps=4, max_tokens_plot=256)


QS = ("hidden", "k", "v", "attn_out")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request):
    return tiny_model(request.param)


def worst(values) -> float:
    return max(abs(1.0 - x) for x in values)


def test_empty_skip_set_is_identity(lm):
    r = drift(lm, tiny_prompt(14), RunSetting(()), CFG)
    for q in QS:
        d = worst(getattr(r, f"{q}_min"))
        assert d < 1e-6, f"{q}: min cosine departs from 1 by {d}"
        d = worst(x for row in getattr(r, f"{q}_tok") for x in row)
        assert d < 1e-6, f"{q}_tok: departs from 1 by {d}"
    assert max(r.kl) < 1e-6, f"KL {r.kl}"
    assert r.top1_agree == [1.0] * CFG.decode_steps


def test_layers_before_first_skipped_match_and_drift_starts_after_it(lm):
    skip = (3, 4, 5)
    r = drift(lm, tiny_prompt(14), RunSetting(skip), CFG)
    for q in ("hidden", "k", "v", "attn_out"):
        d = worst(getattr(r, f"{q}_min")[:3])
        assert d < 1e-6, f"{q} before layer 3 departs from 1 by {d}"
    # Layer 3 projects the same incoming hidden state in both runs: its K/V (and so its decode
    # attention) are the full model's; its output is not (POP passes the input through).
    for q in ("k", "v", "attn_out"):
        d = abs(1.0 - getattr(r, f"{q}_min")[3])
        assert d < 1e-6, f"first skipped layer's {q} departs from full by {d}"
    assert r.hidden_cos[3] < 0.999, f"hidden after the first skipped layer: {r.hidden_cos[3]}"
    for q in ("k", "v", "attn_out"):
        cos = getattr(r, f"{q}_cos")
        assert cos[4] < 0.999, f"{q} at layer 4 shows no drift: {cos}"
    assert min(r.kl) >= 0.0 and max(r.kl) > 1e-6, f"KL {r.kl}"


def test_pop_hidden_of_skipped_layers_is_the_last_kept_output(lm):
    """POP's recorded hidden state is constant through the skipped block (pass-through)."""
    ids = torch.tensor([tiny_prompt(10)])
    adapter = lm.adapter
    full = drift_mod._run(adapter, ids, RunSetting((3, 4, 5), "full"), None, 2, lambda m: None)
    pop = drift_mod._run(adapter, ids, RunSetting((3, 4, 5)), full.fed, 2, lambda m: None)
    for i in (3, 4, 5):
        d = (pop.hidden[i] - full.hidden[2]).abs().max().item()
        assert d < 1e-5, f"layer {i}: max_diff {d} from the last kept output"
    assert pop.hidden[0].shape == (9, adapter.shape.hidden)


def test_skipping_layer_zero_passes_the_embedding_on():
    lm = tiny_model("llama")
    r = drift(lm, tiny_prompt(10), RunSetting((0, 1)), CFG)
    assert r.hidden_cos[0] < 0.999 and worst(r.k_min[:1]) < 1e-6 and r.k_cos[1] < 0.999


def test_hooks_removed_after_a_run_and_after_an_error(monkeypatch):
    lm = tiny_model("qwen3")
    ids = torch.tensor([tiny_prompt(9)])
    with torch.inference_mode():
        before = lm.model(ids).logits
    drift(lm, ids[0].tolist(), RunSetting((4, 5)), CFG)
    with torch.inference_mode():
        after = lm.model(ids).logits
    assert torch.equal(before, after), f"max_diff {(before - after).abs().max().item()}"
    assert_no_hooks(lm)

    def boom(*_a, **_k):
        raise RuntimeError("decode failed")

    monkeypatch.setattr(drift_mod, "decode_step", boom)
    with pytest.raises(RuntimeError, match="decode failed"):
        drift(lm, ids[0].tolist(), RunSetting((4, 5)), CFG)
    assert_no_hooks(lm)


def assert_no_hooks(lm):
    a = lm.adapter
    for i in range(a.n_layers):
        assert not a.layers[i]._forward_hooks, f"layer {i} keeps a forward hook"
        assert not a.o_proj(i)._forward_pre_hooks, f"o_proj {i} keeps a pre-hook"


def test_shapes_downsampling_and_progress():
    lm = tiny_model("llama")
    seen = []
    r = drift(lm, tiny_prompt(40), RunSetting((4, 5)),
              DriftConfig(decode_steps=3, max_tokens_plot=8), progress=seen.append)
    L = lm.adapter.n_layers
    assert len(r.hidden_cos) == len(r.v_min) == L
    assert [len(row) for row in r.hidden_tok] == [8] * L and len(r.k_tok[0]) == 8
    assert [len(row) for row in r.attn_out_tok] == [3] * L
    assert len(r.kl) == len(r.top1_agree) == 3 and len(r.decode_tokens) == 3
    assert r.token_positions[0] == 0 and len(r.token_positions) == 8 and r.prompt_tokens == 40
    assert r.tokens is None  # tiny models have no tokenizer
    # bins are means of the per-token cosines, so each column lies within the layer's range
    for i in range(L):
        assert r.hidden_min[i] - 1e-9 <= min(r.hidden_tok[i])
    assert seen[-1].done == seen[-1].total == 6
    assert set(r.quantiles) == set(QS) and len(r.quantiles["v"]["0.1"]) == L


def test_round_trip_cache_and_average(tmp_results):
    lm = tiny_model("mistral")
    r1, hit1 = cached_drift(lm, tiny_prompt(12), RunSetting((4, 5)), CFG)
    r2, hit2 = cached_drift(lm, tiny_prompt(12), RunSetting((4, 5)), CFG)
    assert (hit1, hit2) == (False, True)
    assert r2.to_dict() == json.loads(json.dumps(r1.to_dict()))
    assert DriftResult.from_dict(r1.to_dict()).v_cos == r1.v_cos
    other = drift(lm, tiny_prompt(16, seed=3), RunSetting((4, 5)), CFG)
    avg = average([r1, other])
    assert avg.n_prompts == 2
    assert avg.v_cos[5] == pytest.approx((r1.v_cos[5] + other.v_cos[5]) / 2)
    assert avg.v_min[5] == min(r1.v_min[5], other.v_min[5])


def test_sliding_window_cache_positions_left_out(tmp_results):
    """A sliding layer's cache drops old prompt keys: those cells are NaN (null in JSON) and the
    statistics cover the positions it still holds."""
    lm = tiny_model("mistral", sliding_window=8)
    r = drift(lm, tiny_prompt(14), RunSetting(()), CFG)
    row = r.k_tok[0]
    assert all(x != x for x in row[:7]) and worst(row[7:]) < 1e-6, row
    assert worst(r.k_cos + r.v_min) < 1e-6 and max(r.kl) < 1e-6
    cached, _ = cached_drift(lm, tiny_prompt(14), RunSetting((4, 5)), CFG)
    assert cached.k_tok[0][0] is None and cached.k_cos[5] < 0.999
    both = average([cached, drift(lm, tiny_prompt(14), RunSetting((4, 5)), CFG)])
    assert both.k_cos[5] == pytest.approx(cached.k_cos[5]), both.k_cos


def test_bad_input_is_one_clear_error():
    lm = tiny_model("llama")
    with pytest.raises(DriftError, match="at least 2 tokens"):
        drift(lm, [5], RunSetting((4,)), CFG)
    with pytest.raises(SettingError, match=r"layer\(s\) 9 out of range"):
        drift(lm, tiny_prompt(8), RunSetting((9,)), CFG)
    with pytest.raises(DriftError, match="compares pop or pop_repair"):
        drift(lm, tiny_prompt(8), RunSetting((4,), "static"), CFG)
    with pytest.raises(DriftError, match="no tokenizer"):
        drift_by_length(lm, [16], RunSetting((4,)), CFG)


def test_cosine_and_kl_helpers():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])  # (3, 2)
    b = torch.tensor([[0.0, 2.0], [0.0, 0.0], [-1.0, -1.0]])
    assert cosine(a, b).tolist() == pytest.approx([0.0, 1.0, -1.0], abs=1e-12)
    p = torch.tensor([[0.0, 0.0], [5.0, 0.0]])
    assert kl_full_pop(p, p).abs().max().item() < 1e-12
    q = torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64), -1)  # (2,)
    ref = (0.5 * torch.log(0.5 / q)).sum().item()
    got = kl_full_pop(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
    assert got.item() == pytest.approx(ref, rel=1e-9)


def test_cli_bad_lengths_are_one_line_while_the_flags_are_parsed(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["drift", "--prompt", "x", "--lengths", "a,b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "argument --lengths: each value" in err[0]
