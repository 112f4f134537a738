"""Batched prompts (left padding + attention mask) give what each prompt gives alone, in the
pruned prefill, the boundary step, decode and greedy generation."""
import pytest
import torch
from test_families import SKIP, build

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.pop import (
    PromptError,
    decode_step,
    greedy_batch,
    left_pad,
    run_prompt,
    teacher_force,
)
from pop_vllm.run_setting import RunSetting

from tiny import tiny_prompt

PROMPTS = [tiny_prompt(14, seed=1), tiny_prompt(6, seed=2), tiny_prompt(11, seed=3), [7]]
FAMILIES = ("llama", "qwen3", "mistral_sliding", "gemma2", "gemma3_text")


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return build(request.param)


@pytest.mark.parametrize("variant", ["full", "pop", "pop_no_kv"])
def test_batched_prefill_boundary_and_decode_equal_unbatched(lm, variant):
    a = lm.adapter
    ids, mask = left_pad(PROMPTS, pad_id=3)  # (B, N) each
    batch = run_prompt(a, ids, RunSetting(SKIP, variant), attention_mask=mask)
    follow = torch.tensor([[11], [12], [13], [14]])  # the same forced tokens, one per row
    steps_b, m = [], mask
    for t in range(3):
        m = torch.cat([m, torch.ones_like(m[:, :1])], dim=1)  # (B, position+1)
        steps_b.append(decode_step(a, follow + t, batch.cache, batch.position + t,
                                   attention_mask=m))
    for row, p in enumerate(PROMPTS):
        one = run_prompt(a, torch.tensor([p]), RunSetting(SKIP, variant))
        diff = (batch.logits[row] - one.logits[0]).abs().max().item()
        assert diff < 1e-4, f"{lm.name} {variant} row {row} first logits: max_diff {diff}"
        for t in range(3):
            ref = decode_step(a, follow[row:row + 1] + t, one.cache, one.position + t)
            diff = (steps_b[t][row] - ref[0]).abs().max().item()
            assert diff < 1e-4, f"{lm.name} {variant} row {row} decode {t}: max_diff {diff}"


@pytest.mark.parametrize("variant", ["full", "pop"])
def test_batched_greedy_generation_equals_unbatched(lm, variant):
    cfg = SamplingConfig(max_new_tokens=8, stop_at_eos=False)
    batched = greedy_batch(lm.adapter, PROMPTS, RunSetting(SKIP, variant), cfg.max_new_tokens)
    alone = [run(lm, p, RunSetting(SKIP, variant), cfg).token_ids for p in PROMPTS]
    assert batched == alone, f"{lm.name} {variant}: batched {batched} vs alone {alone}"


def test_batched_teacher_forcing_equals_unbatched(lm):
    a = lm.adapter
    ids, mask = left_pad(PROMPTS[:3])
    cont = torch.tensor([tiny_prompt(5, seed=s) for s in (7, 8, 9)])  # (3, 5)
    first = run_prompt(a, ids, RunSetting(SKIP), attention_mask=mask)
    full_mask = torch.cat([mask, torch.ones_like(cont)], dim=1)  # (3, N+5)
    chunk = teacher_force(a, cont, first.cache, first.position, attention_mask=full_mask)
    for row, p in enumerate(PROMPTS[:3]):
        one = run_prompt(a, torch.tensor([p]), RunSetting(SKIP))
        ref = teacher_force(a, cont[row:row + 1], one.cache, one.position)
        diff = (chunk[row] - ref[0]).abs().max().item()
        assert diff < 1e-4, f"{lm.name} row {row}: max_diff {diff}"


def test_left_padded_full_greedy_equals_hf_generate():
    lm = build("llama")
    ids, mask = left_pad(PROMPTS, pad_id=0)
    out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    assert greedy_batch(lm.adapter, PROMPTS, RunSetting.full(), 6) == out[:, ids.shape[1]:].tolist()


def test_bad_padding_is_a_clear_error():
    a = build("llama").adapter
    ids, mask = left_pad(PROMPTS)
    with pytest.raises(PromptError, match="pad batches on the left"):
        run_prompt(a, ids, RunSetting(SKIP), attention_mask=mask.flip(1))
    with pytest.raises(PromptError, match="attention_mask must be"):
        run_prompt(a, ids, RunSetting(SKIP, "full"), attention_mask=mask[:, 1:])
    with pytest.raises(PromptError, match="at least one token"):
        left_pad([[1, 2], []])
