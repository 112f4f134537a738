"""Self-healing POP on the embedded models (real weights, fp32): after the healing horizon every
layer's K/V at every position equal the full model's cache for the same tokens, teacher-forced,
within 1e-4, and the next-token KL is at most 1e-6. The prompts (real instructions from the shared
data, read by path) are longer than Gemma-3's 512-token sliding window.

Where fp32 rounding alone exceeds 1e-4, the bound is twice that floor: the full model's own cache
built as a prefill and decode steps differs from its teacher-forced cache by that much (Gemma-3
on an AVX-512 CPU: 1.0e-4 at layer 11, below every skipped layer, where K reaches 98)."""
import pytest
import torch

from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.engine.heal import heal_greedy, heal_prompt
from pop_analysis.engine.pop import decode_step, teacher_force
from pop_analysis.engine.skipset import resolve
from pop_vllm.healing import make
from pop_vllm.run_setting import RunSetting

TOL, KL_TOL = 1e-4, 1e-6
TOKENS = 560  # past the 512-token window: the local layers' caches have dropped keys


def long_prompt(lm, shared_data) -> list[int]:
    texts = load_prompts(str(shared_data / "wizardlm_testset.jsonl"), limit=60).prompts
    ids = encode(lm, "\n\n".join(texts), raw=True)
    assert len(ids) > TOKENS, len(ids)
    return ids[:TOKENS]


def max_gap(a, cache, ref) -> float:
    """The largest |K - K_ref| or |V - V_ref| over every layer and position."""
    kv = 0.0
    for i in range(a.n_layers):
        got, want = a.cached_kv(cache, i), a.cached_kv(ref, i)
        assert got[0].shape == want[0].shape, (i, got[0].shape, want[0].shape)
        kv = max(kv, *((g - w).abs().max().item() for g, w in zip(got, want)))
    return kv


def rounding_floor(a, ids: list[int], n_prompt: int, ref) -> float:
    """The full model's own cache for `ids` as a prefill of the prompt and one decode step per
    token, against `ref` (the same tokens teacher-forced): fp32 rounding alone."""
    cache = a.new_cache()
    teacher_force(a, torch.tensor([ids[:n_prompt]]), cache, 0)
    for pos in range(n_prompt, len(ids)):
        decode_step(a, torch.tensor([[ids[pos]]]), cache, pos)
    return max_gap(a, cache, ref)


def gaps(lm, prompt, skip, heal, n_new):
    """Heal while decoding n_new tokens, feed the last one, and compare with the full model:
    (healer, max K/V gap, next-token KL, the rounding floor of the same comparison)."""
    a = lm.adapter
    first, healer = heal_prompt(a, torch.tensor([prompt]), RunSetting(skip, heal=heal))
    toks = heal_greedy(a, first, healer, n_new)[0].tolist()
    ids = prompt + toks
    logits = decode_step(a, torch.tensor([[toks[-1]]]), first.cache, len(ids) - 1)[0]  # (V,)
    ref = a.new_cache()
    ref_logits = teacher_force(a, torch.tensor([ids]), ref, 0)[0, -1]  # (V,)
    p, q = torch.log_softmax(ref_logits, -1), torch.log_softmax(logits, -1)
    return (healer, max_gap(a, first.cache, ref), float((p.exp() * (p - q)).sum()),
            rounding_floor(a, ids, len(prompt), ref))


@pytest.mark.parametrize("name", ["embedded", "gemma"])
@pytest.mark.parametrize("case", ["tail-eager", "non-contiguous-budget"])
def test_healed_cache_is_the_full_models(name, case, request, shared_data):
    lm = request.getfixturevalue(name)
    n = lm.adapter.n_layers
    if case == "tail-eager":
        skip, heal = resolve(n, ratio=0.33), make("eager", chunk=128)
    else:  # every third layer from the middle up: kept layers sit between skipped ones
        skip, heal = tuple(range(n // 3, n, 3)), make("budget", chunk=64, budget_positions=160)
    healer, kv, kl, floor = gaps(lm, long_prompt(lm, shared_data), skip, heal, 8)
    assert healer.finished and healer.horizon is not None and healer.horizon <= 5
    bound = max(TOL, 2 * floor)
    assert kv <= bound and kl <= KL_TOL, (f"{lm.name} {case}: max |dK|,|dV| {kv:.2e} (bound "
                                          f"{bound:.2e}, rounding floor {floor:.2e}), KL {kl:.2e}")


def test_plain_pop_is_far_from_the_full_cache(embedded, shared_data):
    """The check above can fail: without healing the same comparison is far off."""
    _, kv, kl, floor = gaps(embedded, long_prompt(embedded, shared_data), resolve(30, ratio=0.33),
                            make("none"), 8)
    assert kv > 100 * max(TOL, 2 * floor) and kl > KL_TOL, (kv, kl, floor)


def test_the_generator_reports_the_healing(embedded):
    ids = encode(embedded, "List three facts about the moon.")
    cfg = SamplingConfig(max_new_tokens=6, stop_at_eos=False)
    setting = RunSetting(resolve(30, ratio=0.33), heal=make("budget", chunk=8, budget_positions=12))
    g = run(embedded, ids, setting, cfg)
    rep = g.heal
    assert (rep["policy"], rep["chunk"], rep["budget_positions"]) == ("budget", 8, 12)
    assert rep["finished"] and rep["healed_positions"] == rep["positions"] == len(ids) + 5
    assert rep["horizon_tokens"] == -(-(len(ids) - 1) // 11)  # 12 per step, one more each step
