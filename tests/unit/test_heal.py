"""Self-healing POP on tiny random models: once healing is done, every layer's K/V at every
position equal the full model's cache for the same tokens (teacher-forced), and the next-token
distribution is the full model's; before it is done, the healed prefix already is."""
import pytest
import torch

from pop_analysis.engine.heal import heal_greedy, heal_prompt
from pop_analysis.engine.pop import decode_step, teacher_force
from pop_vllm.healing import HealError, make, parse_budget
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

TOL = 1e-4  # fp32: chunked and one-pass attention differ by rounding only
KL_TOL = 1e-6


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3_text", "mistral_sliding"])
def lm(request):
    return tiny_model(request.param)


def healed_run(lm, prompt, skip, heal, n_new):
    a = lm.adapter
    first, healer = heal_prompt(a, torch.tensor([prompt]), RunSetting(skip, heal=heal))
    toks = heal_greedy(a, first, healer, n_new)[0].tolist()
    return first.cache, healer, toks


def reference(lm, ids):
    """The full model's cache and last logits for `ids`, teacher-forced in one pass."""
    cache = lm.adapter.new_cache()
    logits = teacher_force(lm.adapter, torch.tensor([ids]), cache, 0)  # (1, T, V)
    return cache, logits[0, -1]


def kv_gap(a, cache, ref, layers=None, upto=None) -> float:
    """Largest |K - K_full| or |V - V_full| over `layers` (all) and positions [0, upto) (all)."""
    gap = 0.0
    for i in layers or range(a.n_layers):
        got, want = a.cached_kv(cache, i), a.cached_kv(ref, i)
        assert got[0].shape == want[0].shape, (i, got[0].shape, want[0].shape)
        for g, w in zip(got, want):
            gap = max(gap, (g[:, :, :upto] - w[:, :, :upto]).abs().max().item())
    return gap


def next_token_check(lm, cache, prompt, toks):
    """Feed the last token to the healed cache and to the full model: (K/V gap, KL)."""
    a = lm.adapter
    ids = prompt + toks
    logits = decode_step(a, torch.tensor([[toks[-1]]]), cache, len(ids) - 1)[0]  # (V,)
    ref_cache, ref_logits = reference(lm, ids)
    p = torch.log_softmax(ref_logits, -1)
    q = torch.log_softmax(logits, -1)
    kl = float((p.exp() * (p - q)).sum())
    return kv_gap(a, cache, ref_cache), kl


@pytest.mark.parametrize("skip", [(3, 4, 5), (2, 4)], ids=["tail", "non-contiguous"])
@pytest.mark.parametrize("heal", [make("eager", chunk=5), make("budget", chunk=4, budget_positions=6),
                                  make("budget", chunk=3, budget_ms=10_000)],
                         ids=["eager", "budget-positions", "budget-ms"])
def test_after_the_horizon_the_cache_is_the_full_models(lm, skip, heal):
    prompt = tiny_prompt(17)
    cache, healer, toks = healed_run(lm, prompt, skip, heal, 10)
    assert healer.finished and healer.horizon is not None and healer.horizon <= 10
    gap, kl = next_token_check(lm, cache, prompt, toks)
    assert gap <= TOL and kl <= KL_TOL, f"max |dK|,|dV| {gap:.2e}, KL {kl:.2e}"


def test_without_healing_the_cache_is_not_the_full_models(lm):
    """The check above can fail: plain POP's cache differs from the full model's."""
    prompt = tiny_prompt(17)
    cache, healer, toks = healed_run(lm, prompt, (2, 4), make("none"), 10)
    assert healer is None
    gap, kl = next_token_check(lm, cache, prompt, toks)
    assert gap > 100 * TOL, gap


def test_eager_heals_everything_before_the_second_token():
    lm = tiny_model("llama")
    cache, healer, toks = healed_run(lm, tiny_prompt(20), (3, 4, 5), make("eager", chunk=6), 5)
    rep = healer.report()
    assert rep["horizon_tokens"] == 1 and rep["finished"] and rep["chunks"] == 4  # 6+6+6+2
    assert [(c.start, c.end) for c in healer.chunks] == [(0, 6), (6, 12), (12, 18), (18, 20)]
    assert all(c.step == 0 for c in healer.chunks) and len(rep["heal_ms_per_step"]) == 1
    assert rep["healed_positions"] == rep["positions"] == 24  # 20 prompt + 4 fed back


def test_a_budget_of_positions_is_kept_each_step():
    lm = tiny_model("llama")
    c = 5
    _, healer, toks = healed_run(lm, tiny_prompt(20), (3, 4, 5), make("budget", chunk=2, budget_positions=c), 12)
    per_step = {}
    for ch in healer.chunks:
        assert ch.end - ch.start <= 2
        per_step[ch.step] = per_step.get(ch.step, 0) + ch.end - ch.start
    assert max(per_step.values()) <= c
    # Before the k-th decode step 20 + k - 1 positions are known and 5k healed: done at k = 5.
    assert healer.horizon == 5 and healer.finished


def test_a_time_budget_too_small_for_a_chunk_still_heals_two_positions_a_step():
    lm = tiny_model("llama")
    _, healer, _ = healed_run(lm, tiny_prompt(20), (3, 4, 5), make("budget", chunk=3, budget_ms=1e-6), 30)
    per_step = {}
    for ch in healer.chunks:
        per_step[ch.step] = per_step.get(ch.step, 0) + ch.end - ch.start
    # The first chunk probes the cost (at most PROBE positions, here the chunk of 3); then each
    # step heals the minimum of two, one more than the decode step adds.
    assert per_step[0] == 3 and all(n == 2 for s, n in per_step.items() if s and s < max(per_step))
    # Before the k-th decode step 20 + k - 1 positions are known and 2k + 1 healed: k = 18.
    assert healer.finished and healer.horizon == 18


def test_generation_that_ends_before_healing_leaves_an_exact_prefix():
    lm = tiny_model("llama")
    prompt = tiny_prompt(30)
    cache, healer, toks = healed_run(lm, prompt, (2, 4), make("budget", chunk=8, budget_positions=2), 4)
    rep = healer.report()
    assert not rep["finished"] and rep["horizon_tokens"] is None
    assert rep["healed_positions"] == 6 and rep["positions"] == 33  # 3 decode steps of 2
    ref, _ = reference(lm, prompt + toks[:-1])
    assert kv_gap(lm.adapter, cache, ref, upto=6) <= TOL
    assert kv_gap(lm.adapter, cache, ref) > 100 * TOL  # the rest is still POP's


def test_a_prompt_shorter_than_one_chunk():
    lm = tiny_model("qwen3")
    prompt = tiny_prompt(3)
    cache, healer, toks = healed_run(lm, prompt, (4, 5), make("eager"), 6)  # chunk 64
    assert [(c.start, c.end) for c in healer.chunks] == [(0, 3)]
    gap, kl = next_token_check(lm, cache, prompt, toks)
    assert gap <= TOL and kl <= KL_TOL


def test_a_one_token_generation_heals_nothing():
    lm = tiny_model("llama")
    _, healer, toks = healed_run(lm, tiny_prompt(9), (3, 4, 5), make("eager"), 1)
    assert len(toks) == 1 and healer.report()["healed_positions"] == 0 and not healer.chunks


def test_full_has_nothing_to_heal():
    lm = tiny_model("llama")
    first, healer = heal_prompt(lm.adapter, torch.tensor([tiny_prompt(9)]),
                                RunSetting((3, 4, 5), "full", heal=make("eager")))
    assert healer.finished and healer.horizon == 0


def test_healing_batches_with_left_padding_match_one_by_one():
    """Eager: the same tokens batched (left-padded) as one by one. (Under a budget a padded
    row's schedule differs: its pad positions are healed too, so its window is longer.)"""
    from pop_analysis.engine.pop import left_pad

    lm = tiny_model("llama")
    a = lm.adapter
    prompts = [tiny_prompt(11, seed=3), tiny_prompt(7, seed=4)]
    heal = make("eager", chunk=3)
    ids, mask = left_pad(prompts)
    first, healer = heal_prompt(a, ids, RunSetting((2, 4), heal=heal), attention_mask=mask)
    batch = heal_greedy(a, first, healer, 8).tolist()
    assert healer.finished
    for row, p in zip(batch, prompts):
        assert row == healed_run(lm, p, (2, 4), heal, 8)[2]


@pytest.mark.parametrize("kwargs, words", [
    (dict(policy="fast"), "unknown heal policy"),
    (dict(policy="eager", chunk=0), "chunk must be an integer"),
    (dict(policy="eager", chunk=2.5), "chunk must be an integer"),
    (dict(policy="eager", budget_positions=4), "applies to heal policy budget only"),
    (dict(policy="budget"), "exactly one of"),
    (dict(policy="budget", budget_positions=4, budget_ms=2.0), "exactly one of"),
    (dict(policy="budget", budget_positions=1), "never catch up"),
    (dict(policy="budget", budget_ms=float("nan")), "budget_ms must be a number"),
    (dict(policy="budget", budget_ms=0), "budget_ms must be a number"),
])
def test_bad_options_are_refused_in_one_line(kwargs, words):
    with pytest.raises(HealError) as err:
        make(**kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, want", [("16", {"budget_positions": 16}), ("8pos", {"budget_positions": 8}),
                                        ("2.5ms", {"budget_ms": 2.5})])
def test_budgets_as_written(text, want):
    assert parse_budget(text) == want


@pytest.mark.parametrize("variant", ["static", "pop_no_kv", "pop_no_boundary"])
def test_variants_without_a_healable_cache_are_refused(variant):
    with pytest.raises(HealError, match=f"not {variant}"):
        RunSetting((3, 4, 5), variant, heal=make("eager"))  # refused where it is built
    with pytest.raises(HealError, match="heal budget must read like"):
        parse_budget("fast")


@pytest.mark.parametrize("flags, words", [
    (["--heal", "budget"], "exactly one of"),
    (["--heal", "budget", "--heal-budget", "1"], "never catch up"),
    (["--heal", "budget", "--heal-budget", "fast"], "heal budget must read like"),
    (["--heal", "eager", "--heal-budget", "8"], "applies to heal policy budget only"),
    (["--heal", "eager", "--variants", "full,static"], "not static"),
    (["--heal", "soon"], "invalid choice"),
])
def test_the_cli_refuses_bad_healing_in_one_line_before_loading_a_model(flags, words, capsys,
                                                                        monkeypatch):
    from pop_analysis import cli
    from pop_analysis.commands import generate

    def no_model(*_):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(generate, "load", no_model)
    with pytest.raises(SystemExit) as done:
        raise SystemExit(cli.main(["generate", "--prompt", "hi", *flags]))
    assert done.value.code != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and words in err[-1], err


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_the_drift_of_each_layer_falls_to_zero_as_healing_proceeds(family):
    from pop_analysis.inspection.heal_drift import healing_drift

    lm = tiny_model(family)
    heal = make("budget", chunk=4, budget_positions=6)
    r = healing_drift(lm, tiny_prompt(20), RunSetting((2, 4), heal=heal), 8)
    assert r.tokens_out == list(range(1, 9)) and r.horizon == 4  # 6 per step: 24 >= 20 + 3
    for drift in (r.k, r.v):
        # Up to f itself nothing differs (layer f projects K/V from its exact input).
        assert all(d < 1e-5 for step in drift for d in step[:3]), "up to f nothing differs"
        assert all(d > 1e-3 for d in drift[0][3:]), "plain POP's drift at the first token"
        for i in range(3, 6):  # every layer above f, the kept layers 3 and 5 included
            col = [step[i] for step in drift]
            if lm.adapter.windows[i] is None:  # a window's moving rows make its mean jump
                assert all(b <= a + 1e-6 for a, b in zip(col, col[1:])), (i, col)
            assert all(d < 1e-5 for d in col[4:]), (i, col)  # exact once 4 tokens are out


def test_the_healing_drift_goes_through_the_results_store_and_its_record_is_checked(tmp_results):
    from pop_analysis.inspection.heal_drift import KIND, HealDrift, cached_healing_drift
    from pop_analysis.store.records import RecordError, check

    lm = tiny_model("llama")
    setting = RunSetting((2, 4), heal=make("budget", chunk=4, budget_positions=6))
    first, hit = cached_healing_drift(lm, tiny_prompt(20), setting, 8)
    again, hit_again = cached_healing_drift(lm, tiny_prompt(20), setting, 8)
    assert (hit, hit_again) == (False, True) and again == first and first.horizon == 4
    other, hit_other = cached_healing_drift(lm, tiny_prompt(20), setting.replace(
        heal=make("budget", chunk=4, budget_positions=12)), 8)
    assert not hit_other and other.horizon < first.horizon  # the budget is part of the key
    good = first.to_dict()
    check(KIND, HealDrift, good, lm.adapter.n_layers)
    bad_records = [({"v": good["v"][:-1]}, "v has"), ({"k": [r[:-1] for r in good["k"]]}, r"k\[0\]"),
                   ({"healed": good["healed"][:-1]}, "healed"), ({"skip_layers": [2, 9]}, "skip_layers")]
    for bad, where in bad_records:
        with pytest.raises(RecordError, match=where):
            check(KIND, HealDrift, {**good, **bad}, lm.adapter.n_layers)
