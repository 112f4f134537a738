"""Self-healing POP on the embedded models (real weights, fp32): after the healing horizon every
layer's K/V at every position equal the full model's cache for the same tokens, teacher-forced,
within 1e-4, and the next-token KL is at most 1e-6. The prompts (real instructions from the shared
data, read by path) are longer than Gemma-3's 512-token sliding window."""
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


def gaps(lm, prompt, skip, heal, n_new):
    """Heal while decoding n_new tokens, feed the last one, and compare with the full model."""
    a = lm.adapter
    first, healer = heal_prompt(a, torch.tensor([prompt]), RunSetting(skip, heal=heal))
    toks = heal_greedy(a, first, healer, n_new)[0].tolist()
    ids = prompt + toks
    logits = decode_step(a, torch.tensor([[toks[-1]]]), first.cache, len(ids) - 1)[0]  # (V,)
    ref = a.new_cache()
    ref_logits = teacher_force(a, torch.tensor([ids]), ref, 0)[0, -1]  # (V,)
    kv = 0.0
    for i in range(a.n_layers):
        got, want = a.cached_kv(first.cache, i), a.cached_kv(ref, i)
        assert got[0].shape == want[0].shape, (i, got[0].shape, want[0].shape)
        kv = max(kv, *((g - w).abs().max().item() for g, w in zip(got, want)))
    p, q = torch.log_softmax(ref_logits, -1), torch.log_softmax(logits, -1)
    return healer, kv, float((p.exp() * (p - q)).sum())


@pytest.mark.parametrize("name", ["embedded", "gemma"])
@pytest.mark.parametrize("case", ["tail-eager", "non-contiguous-budget"])
def test_healed_cache_is_the_full_models(name, case, request, shared_data):
    lm = request.getfixturevalue(name)
    n = lm.adapter.n_layers
    if case == "tail-eager":
        skip, heal = resolve(n, ratio=0.33), make("eager", chunk=128)
    else:  # every third layer from the middle up: kept layers sit between skipped ones
        skip, heal = tuple(range(n // 3, n, 3)), make("budget", chunk=64, budget_positions=160)
    healer, kv, kl = gaps(lm, long_prompt(lm, shared_data), skip, heal, 8)
    assert healer.finished and healer.horizon is not None and healer.horizon <= 5
    assert kv <= TOL and kl <= KL_TOL, f"{lm.name} {case}: max |dK|,|dV| {kv:.2e}, KL {kl:.2e}"


def test_plain_pop_is_far_from_the_full_cache(embedded, shared_data):
    """The check above can fail: without healing the same comparison is far off."""
    _, kv, kl = gaps(embedded, long_prompt(embedded, shared_data), resolve(30, ratio=0.33),
                     make("none"), 8)
    assert kv > 100 * TOL and kl > KL_TOL, (kv, kl)


def test_the_generator_reports_the_healing(embedded):
    ids = encode(embedded, "List three facts about the moon.")
    cfg = SamplingConfig(max_new_tokens=6, stop_at_eos=False)
    setting = RunSetting(resolve(30, ratio=0.33), heal=make("budget", chunk=8, budget_positions=12))
    g = run(embedded, ids, setting, cfg)
    rep = g.heal
    assert (rep["policy"], rep["chunk"], rep["budget_positions"]) == ("budget", 8, 12)
    assert rep["finished"] and rep["healed_positions"] == rep["positions"] == len(ids) + 5
    assert rep["horizon_tokens"] == -(-(len(ids) - 1) // 11)  # 12 per step, one more each step
