"""Quality evaluation on tiny random models: NLL against HF's forward, POP scores against step-by-step decode, agreement, GSM8K answers."""
import pytest
import torch

from pop_analysis.engine.pop import decode_step, run_prompt
from pop_analysis.quality.answers import answer_matches, extract_answer, gsm8k_gold
from pop_analysis.quality.evaluate import FULL, Arm, evaluate_variants
from pop_analysis.quality.items import EvalDataError, EvalItem
from pop_analysis.quality.metrics import agreement, score_continuations
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama")


def test_full_nll_equals_hf_forward(lm):
    prompt, cont = tiny_prompt(9), tiny_prompt(6, seed=2)
    got = score_continuations(lm, prompt, [cont], RunSetting.full())[0]
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt + cont])).logits[0].float()  # (N+M, V)
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)  # (M, V)
    ref = lp.gather(1, torch.tensor(cont)[:, None])[:, 0]
    diff = (torch.tensor(got.logprobs) - ref).abs().max().item()
    assert diff < 1e-4, f"max_diff {diff}"
    assert got.argmax == lp.argmax(-1).tolist()


def test_pop_scores_match_step_by_step_decode(lm):
    a, skip = lm.adapter, (3, 4, 5)
    prompt, cont = tiny_prompt(10), tiny_prompt(5, seed=3)
    got = score_continuations(lm, prompt, [cont], RunSetting(skip))[0].logprobs
    first = run_prompt(a, torch.tensor([prompt]), RunSetting(skip))
    ref, logits, pos = [], first.logits, first.position
    for tok in cont:
        ref.append(torch.log_softmax(logits[0], -1)[tok].item())
        logits = decode_step(a, torch.tensor([[tok]]), first.cache, pos)
        pos += 1
    diff = max(abs(x - y) for x, y in zip(got, ref))
    assert diff < 1e-4, f"max_diff {diff}"
    full = score_continuations(lm, prompt, [cont], RunSetting.full())[0].logprobs
    assert max(abs(x - y) for x, y in zip(got, full)) > 1e-4, "pruning the prefill changed nothing"


def test_pop_with_empty_skip_scores_like_full(lm):
    prompt, cont = tiny_prompt(8), tiny_prompt(4, seed=5)
    pop = score_continuations(lm, prompt, [cont], RunSetting(()))[0].logprobs
    full = score_continuations(lm, prompt, [cont], RunSetting.full())[0].logprobs
    assert max(abs(x - y) for x, y in zip(pop, full)) < 1e-4


@pytest.mark.parametrize("variant", ["pop", "pop_no_kv", "static"])
def test_shared_prefill_equals_separate_calls(lm, variant):
    prompt = tiny_prompt(9)
    conts = [tiny_prompt(4, seed=s) for s in (6, 7, 8)]
    together = score_continuations(lm, prompt, conts, RunSetting((4, 5), variant))
    for c, s in zip(conts, together):
        alone = score_continuations(lm, prompt, [c], RunSetting((4, 5), variant))[0]
        assert max(abs(x - y) for x, y in zip(s.logprobs, alone.logprobs)) < 1e-5


def test_full_agreement_with_itself_is_one(lm):
    items = [EvalItem(tuple(tiny_prompt(8, seed=s))) for s in range(3)]
    shallow_v = Arm("shallow", RunSetting((0, 1, 2)))
    out = evaluate_variants(lm, items, [FULL, shallow_v], 6)
    s, shallow = out["full"], out["shallow"]
    assert s.greedy_agreement == s.sequence_exact == [1.0] * 3 and s.first_divergence == [None] * 3
    assert s.teacher_forced_top1 == [1.0] * 3  # the reference is the full model's own greedy output
    assert s.next_token_kl == [0.0] * 3 and s.next_token_top1 == [1.0] * 3
    assert sum(shallow.greedy_agreement) < 3 and sum(shallow.continuation_nll) > sum(s.continuation_nll)
    assert min(shallow.next_token_kl) > 0


def test_agreement_cases():
    assert agreement([1, 2, 3], [1, 2, 3]) == agreement([], []) == agreement([5], [5])
    a = agreement([1, 2, 3, 4], [1, 2, 9, 4])
    assert (a.match_rate, a.first_divergence, a.exact) == (0.75, 2, False)
    b = agreement([1, 2, 3, 4], [1, 2])  # stopped early: the missing tokens count as mismatches
    assert (b.match_rate, b.first_divergence) == (0.5, 2)


def test_gsm8k_answers():
    assert gsm8k_gold("so 9 * 2 = 18\n#### 1,800") == "1800"
    assert extract_answer("The answer is 42.") == "42"
    assert extract_answer("3 apples ... #### $18.00 and 4") == "18"
    assert extract_answer("The pass code is 4821. Not 1234.", first=True) == "4821"
    assert extract_answer("no digits here") is None
    assert answer_matches("we get 7.0", "7") and not answer_matches("we get 7", "8")
    with pytest.raises(EvalDataError, match="####"):
        gsm8k_gold("no marker")
