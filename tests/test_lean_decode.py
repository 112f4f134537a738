"""The lean batched decode step (adapter_decode.py) against HF's decoder forward: same states and
same caches on every Llama-layout family, left padding included; HF's forward wherever hooks,
autograd, sliding windows or another layout need it; the same sampled tokens on the embedded model."""
import pytest
import torch
from test_families import build
from tiny import FAMILIES, tiny_model, tiny_prompt

from pop_analysis.adapter_decode import lean_decode_ok
from pop_analysis.calibrate import CalibrationConfig, sample_seed
from pop_analysis.fisher import left_pad, sample_and_gradients
from pop_analysis.gates import StageGates, gated

PROMPTS = [tiny_prompt(n, seed=40 + n) for n in (3, 11, 7)]


def prefilled(lm, capacity=32):
    """Left-padded prompts run through HF's forward, then two independent forks of the cache."""
    a = lm.adapter
    ids, mask, pos = left_pad(PROMPTS, a.device)  # (B, W) each
    cache = a.new_cache()
    with torch.no_grad():
        a.forward_padded(ids, mask, pos, cache)
    return ids, mask, pos, a.fork_cache(cache, capacity), a.fork_cache(cache, capacity)


def forbid_hf_forward(monkeypatch, adapter):
    def refuse(*args, **kwargs):
        raise AssertionError("the lean step fell back to HF's forward")
    monkeypatch.setattr(adapter, "forward_padded", refuse)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lean_steps_equal_hf_forward(family, monkeypatch):
    lm = tiny_model(family, seed=2)
    lm.model.double()
    a = lm.adapter
    ids, mask, pos, lean_cache, hf_cache = prefilled(lm, capacity=ids_width(PROMPTS) + 3)
    tok, pos = ids[:, -1:], pos[:, -1:]  # (B, 1) each
    hf_forward = a.forward_padded
    with torch.no_grad():
        for step in range(6):  # past the capacity: the buffer grows
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, S+1)
            pos = pos + 1
            want = hf_forward(tok, mask, pos, hf_cache)  # (B, 1, D)
            assert lean_decode_ok(a, lean_cache)
            with monkeypatch.context() as m:
                forbid_hf_forward(m, a)
                got = a.decode_step(tok, mask, pos, lean_cache)
            assert torch.allclose(got, want, rtol=0, atol=1e-10 * float(want.abs().max())), \
                f"{family} step {step}: {(got - want).abs().max()}"
            tok = lm.model.lm_head(got[:, -1]).argmax(-1, keepdim=True)  # (B, 1)
    for i in range(a.n_layers):
        for x, y in zip(a.cached_kv(lean_cache, i), a.cached_kv(hf_cache, i)):
            assert torch.allclose(x, y, rtol=0, atol=1e-10 * float(y.abs().max()))


def ids_width(prompts):
    return max(len(p) for p in prompts)


def test_hf_forward_where_the_lean_step_does_not_apply():
    lm = tiny_model("llama", seed=3)
    a = lm.adapter
    _, _, _, fork, _ = prefilled(lm)
    with torch.no_grad():
        assert lean_decode_ok(a, fork)
        assert not lean_decode_ok(a, a.new_cache())  # a plain cache: HF concatenates
        gates = StageGates.ones(len(PROMPTS), a.n_layers)
        with gated(a, gates, torch.zeros(len(PROMPTS), 1, dtype=torch.long)):
            assert not lean_decode_ok(a, fork)  # gates are hooks: HF's forward runs them
        handle = a.attention(2).register_forward_pre_hook(lambda m, args: None)
        try:
            assert not lean_decode_ok(a, fork)
        finally:
            handle.remove()
        assert lean_decode_ok(a, fork)
    with torch.enable_grad():
        assert not lean_decode_ok(a, fork)
    for name in ("mistral_sliding", "gemma2", "gemma3_text"):  # windows, another layout
        other = build(name, seed=1)
        _, _, _, fork, _ = prefilled(other)
        with torch.no_grad():
            assert not lean_decode_ok(other.adapter, fork), name


def test_embedded_model_samples_the_same_tokens(embedded, monkeypatch):
    """Calibration's sampler on the real model: the lean steps draw the tokens HF's forward draws."""
    prompts = [embedded.tokenizer(t)["input_ids"] for t in
               ("The capital of France is", "Write a haiku about rain.", "1, 2, 3,")]
    seeds = [sample_seed(1, i) for i in range(len(prompts))]
    cfg = CalibrationConfig(n_samples=3, max_new_tokens=12, seed=1)
    import pop_analysis.adapter as adapter_module
    calls = []
    real = adapter_module.lean_decode
    monkeypatch.setattr(adapter_module, "lean_decode", lambda *a: calls.append(1) or real(*a))
    lean, _ = sample_and_gradients(embedded, prompts, seeds, cfg)
    assert len(calls) == max(len(r) for r in lean)  # every step took the lean path
    monkeypatch.setattr(adapter_module, "lean_decode_ok", lambda a, c: False)
    plain, _ = sample_and_gradients(embedded, prompts, seeds, cfg)
    assert lean == plain
    assert all(len(r) > 0 for r in lean)
