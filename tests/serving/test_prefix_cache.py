"""Prefix caching on a POP engine (vLLM's CPU build, the embedded SmolLM2-135M, skip 20-29): the
plugin's block hashes carry the POP settings and where the full path starts, so

- a multi-turn conversation (turn k's prompt = turn k-1's prompt + its answer + a new message)
  reuses exactly the blocks of earlier prompts made only of pruned positions (never the block
  holding x_N, nor the answer's blocks) and equals POP Lab's `pop` token for token;
- a POP request never reuses a block computed for the full model, and the reverse, in one
  engine switched between them at run time; each reuses its own.

One engine (block size 32, a 64-token batch budget: prompts arrive in chunks) for all of it.
"""
from pathlib import Path

import pytest

from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_vllm.run_setting import RunSetting

from vllm_driver import Driver, check_venv, ok

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "cache" / "models" / "smollm2-135m"
TAIL = list(range(20, 30))
BLOCK = 32
N_NEW = 8
CHAT = ["You are a careful assistant who answers briefly and precisely, in one or two sentences, "
        "and never invents facts or sources. Keep every answer short. "
        "What is the capital of France?",  # over a block: turn 2 can reuse one
        " Thanks. And what river runs through that city? Name it and say where it ends.",
        " Good. Now list two other rivers of that country, one in the north and one in the south."]
QUESTION = ("A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes? "
            "Explain each step of the calculation carefully. ") * 2
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0,
          "enable_prefix_caching": True, "block_size": BLOCK, "max_num_batched_tokens": 64,
          "max_num_seqs": 4}
FULL, POP = {"skip": TAIL, "variant": "full"}, {"skip": TAIL, "variant": "pop"}


def reusable(n_prompt: int) -> int:
    """Positions of whole blocks before x_N: what a POP request may take from the cache."""
    return (n_prompt - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def cached(embedded):
    check_venv()
    messages = [encode(embedded, t, raw=True) for t in CHAT]  # no template: no shared preamble
    question = encode(embedded, QUESTION, raw=True)
    runs = [{"chat": messages, "max_tokens": N_NEW},  # 0: POP, from hf_overrides
            {"set": FULL, "prompts": [question], "max_tokens": N_NEW},  # 1: full computes it
            {"set": POP, "prompts": [question], "max_tokens": N_NEW},  # 2: POP may not reuse it
            {"prompts": [question], "max_tokens": N_NEW},  # 3: POP reuses its own
            {"set": FULL, "prompts": [question], "max_tokens": N_NEW}]  # 4: full reuses its own
    driver = Driver("prefix_cache", [{"model": str(MODEL), "engine": ENGINE, "pop": POP,
                                      "runs": runs}])
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        turns, prompt, answer = [], [], []
        for m in messages:  # POP Lab's conversation: each turn on its own answers
            prompt = prompt + answer + m
            answer = run(embedded, prompt, RunSetting(TAIL), cfg).token_ids
            turns.append((prompt, answer))
        ref = {"chat": turns, "pop": run(embedded, question, RunSetting(TAIL), cfg).token_ids,
               "full": run(embedded, question, RunSetting.full(), cfg).token_ids}
    finally:
        job = driver.results()[0]
    return question, ok(job)["runs"], ref


def test_multi_turn_conversation_is_exact_and_reuses_only_pruned_blocks(cached):
    _, runs, ref = cached
    chat = runs[0]
    assert chat["prompts"] == [p for p, _ in ref["chat"]]
    assert chat["tokens"] == [a for _, a in ref["chat"]]
    assert chat["cached"][0] == 0
    for k in range(1, len(CHAT)):  # turn k reuses turn k-1's pruned blocks, nothing after them
        assert chat["cached"][k] == reusable(len(chat["prompts"][k - 1])) > 0, chat["cached"]
    hit = sum(chat["cached"]) / sum(len(p) for p in chat["prompts"])
    assert hit > 0.3, hit


def test_pop_and_full_never_share_blocks(cached):
    question, runs, ref = cached
    assert ref["pop"] != ref["full"]  # the two K/V paths really differ on this prompt
    full_first, pop_after_full, pop_again, full_again = (runs[i] for i in range(1, 5))
    assert full_first["cached"] == [0] and full_first["tokens"] == [ref["full"]]
    assert pop_after_full["cached"] == [0]  # the full model's blocks are there, never taken
    assert pop_after_full["tokens"] == [ref["pop"]]
    assert pop_again["cached"] == [reusable(len(question))] and pop_again["tokens"] == [ref["pop"]]
    assert full_again["cached"] == [reusable(len(question))]  # its own blocks, not POP's
    assert full_again["tokens"] == [ref["full"]]
