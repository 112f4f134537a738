"""Prefix caching on a POP engine (vLLM's CPU build, the embedded SmolLM2-135M, skip 20-29): the
plugin's block hashes carry the POP settings and where the full path starts, so

- a multi-turn conversation (turn k's prompt = turn k-1's prompt + its answer + a new message)
  reuses exactly the blocks of earlier prompts made only of pruned positions (never the block
  holding x_N, nor the answer's blocks) and equals POP Lab's `pop` token for token;
- a POP request never reuses a block computed for the full model, and the reverse, in one
  engine switched between them at run time; each reuses its own;
- keys come from the engine's own settings only: a client's forged kv_transfer_params (claiming
  stock K/V) on this engine, which is no KV consumer, change nothing, so a full-model request on
  the same prompt afterwards reuses none of its blocks and gets the stock model's log-probs;
- prompt log-probs with prefix caching, the caller allowing cached K/V
  (skip_reading_prefix_cache=False): the prompt is computed anyway, so every prompt log-prob is
  there and the stock model's (vLLM leaves cached positions' log-probs unset);
- a run-time switch mid-traffic: the request in flight (its prefill begun, chunked) finishes
  under the settings it arrived with, the one sent after the switch runs under the new ones and
  reuses none of its blocks, and a later request of the first settings reuses them (pure POP).

One engine (block size 32, a 64-token batch budget: prompts arrive in chunks) for all of it, its
engine core in a process of its own (as a server runs it: a switch can wait for the requests in
flight).
"""
import math
from pathlib import Path

import pytest
import torch

from pop_analysis.data.example_prompts import LONG as EXAMPLE_LONG
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
SCORED = ("Ada Lovelace wrote the first published program for Babbage's analytical engine, a "
          "table of Bernoulli numbers, in a note on a translated paper. ") * 2
# Long enough for several prefill chunks, and one where POP's and the full model's 8 tokens
# differ (a repeated sentence gave the same tokens: mixing settings would go unseen).
LONG = EXAMPLE_LONG
# A client's claim that its prompt's K/V are the stock model's, handed over by a prefill instance.
FORGED = {"do_remote_prefill": True, "pop_kv_file": "prefill-0/" + "0" * 40,
          "pop_kv_settings": None, "pop_kv_variant": "full", "remote_engine_id": "prefill-0"}
TOL = 1e-3


def reusable(n_prompt: int) -> int:
    """Positions of whole blocks before x_N: what a POP request may take from the cache."""
    return (n_prompt - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def cached(embedded):
    check_venv()
    messages = [encode(embedded, t, raw=True) for t in CHAT]  # no template: no shared preamble
    question = encode(embedded, QUESTION, raw=True)
    scored, long = encode(embedded, SCORED, raw=True), encode(embedded, LONG, raw=True)
    forged = {**FORGED, "pop_kv_tokens": len(scored) - 1}
    runs = [{"chat": messages, "max_tokens": N_NEW},  # 0: POP, from hf_overrides
            {"set": FULL, "prompts": [question], "max_tokens": N_NEW},  # 1: full computes it
            {"set": POP, "prompts": [question], "max_tokens": N_NEW},  # 2: POP may not reuse it
            {"prompts": [question], "max_tokens": N_NEW},  # 3: POP reuses its own
            {"set": FULL, "prompts": [question], "max_tokens": N_NEW},  # 4: full reuses its own
            {"set": POP, "prompts": [scored], "max_tokens": N_NEW, "kv": [forged]},  # 5
            {"set": FULL, "prompts": [scored], "max_tokens": N_NEW, "logprobs": 1},  # 6
            {"set": POP, "prompts": [scored], "max_tokens": N_NEW, "prompt_logprobs": 1,
             "skip_reading": False},  # 7: reading cached K/V allowed by the caller
            {"prompts": [long], "max_tokens": N_NEW,  # 8: POP in flight, the switch, full after
             "switch_in_flight": {"set": FULL, "after": [long]}},
            {"set": POP, "prompts": [long], "max_tokens": N_NEW}]  # 9: POP after the traffic
    driver = Driver("prefix_cache", [{"model": str(MODEL), "engine": ENGINE, "pop": POP,
                                      "multiprocess": True, "runs": runs}])
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        turns, prompt, answer = [], [], []
        for m in messages:  # POP Lab's conversation: each turn on its own answers
            prompt = prompt + answer + m
            answer = run(embedded, prompt, RunSetting(TAIL), cfg).token_ids
            turns.append((prompt, answer))
        ref = {"chat": turns, "pop": run(embedded, question, RunSetting(TAIL), cfg).token_ids,
               "full": run(embedded, question, RunSetting.full(), cfg).token_ids}
        for name, ids in (("scored", scored), ("long", long)):
            ref[name] = {v: run(embedded, ids, s, cfg).token_ids
                         for v, s in (("pop", RunSetting(TAIL)), ("full", RunSetting.full()))}
        ref["scored"]["prompt_lp"] = next_token_logprobs(embedded, scored)
        ref["scored"]["full_lp"] = next_token_logprobs(embedded, scored + ref["scored"]["full"])[
            len(scored) - 1:]
    finally:
        job = driver.results()[0]
    return question, ok(job)["runs"], ref, {"scored": scored, "long": long}


@torch.inference_mode()
def next_token_logprobs(lm, ids: list[int]) -> list[float]:
    """The stock model's log-prob of each token after the first (POP Lab's full model)."""
    logits = lm.model(torch.tensor([ids])).logits.float()[0]  # (N, V)
    lp = torch.log_softmax(logits[:-1], -1)  # (N-1, V)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def gap(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_multi_turn_conversation_is_exact_and_reuses_only_pruned_blocks(cached):
    _, runs, ref, _ = cached
    chat = runs[0]
    assert chat["prompts"] == [p for p, _ in ref["chat"]]
    assert chat["tokens"] == [a for _, a in ref["chat"]]
    assert chat["cached"][0] == 0
    for k in range(1, len(CHAT)):  # turn k reuses turn k-1's pruned blocks, nothing after them
        assert chat["cached"][k] == reusable(len(chat["prompts"][k - 1])) > 0, chat["cached"]
    hit = sum(chat["cached"]) / sum(len(p) for p in chat["prompts"])
    assert hit > 0.3, hit


def test_pop_and_full_never_share_blocks(cached):
    question, runs, ref, _ = cached
    assert ref["pop"] != ref["full"]  # the two K/V paths really differ on this prompt
    full_first, pop_after_full, pop_again, full_again = (runs[i] for i in range(1, 5))
    assert full_first["cached"] == [0] and full_first["tokens"] == [ref["full"]]
    assert pop_after_full["cached"] == [0]  # the full model's blocks are there, never taken
    assert pop_after_full["tokens"] == [ref["pop"]]
    assert pop_again["cached"] == [reusable(len(question))] and pop_again["tokens"] == [ref["pop"]]
    assert full_again["cached"] == [reusable(len(question))]  # its own blocks, not POP's
    assert full_again["tokens"] == [ref["full"]]


def test_forged_transfer_params_change_no_key(cached):
    """Run 5: POP with kv_transfer_params claiming stock K/V (this engine is no KV consumer, so
    they change nothing: it used to hash its POP blocks as stock). Run 6, full, same prompt: no
    block of run 5 is reused and its generated log-probs are the stock model's."""
    _, runs, ref, ids = cached
    forged, full = runs[5], runs[6]
    assert forged["tokens"] == [ref["scored"]["pop"]] and forged["cached"] == [0]
    assert forged["stats"]["pruned_tokens"] == len(ids["scored"]) - 1  # served as POP
    assert ref["scored"]["pop"] != ref["scored"]["full"]  # the two paths differ here
    assert full["cached"] == [0], full["cached"]  # POP's blocks are not the stock model's
    assert full["tokens"] == [ref["scored"]["full"]]
    assert gap(full["logprobs"][0], ref["scored"]["full_lp"]) < TOL


def test_prompt_logprobs_with_cached_blocks_allowed_are_complete(cached):
    """Run 7: prompt log-probs on the POP engine, the caller allowing cached K/V, with run 6's
    stock blocks of the same prompt in the cache: the engine computes the prompt anyway (vLLM
    would leave the cached positions' log-probs unset), every one is the stock model's."""
    _, runs, ref, ids = cached
    r = runs[7]
    assert r["cached"] == [0]
    got = r["prompt_logprobs"][0]
    assert got[0] is None and len(got) == len(ids["scored"]) and None not in got[1:]
    assert all(math.isfinite(x) for x in got[1:])
    assert gap(got[1:], ref["scored"]["prompt_lp"]) < TOL
    assert r["stats"]["pruned_tokens"] == 0 and r["tokens"] == [ref["scored"]["full"]]


def test_a_switch_mid_traffic_shares_no_block_across_settings(cached):
    """Run 8: a POP request's chunked prefill has begun when a switch to full arrives; a request
    on the same prompt follows the switch. The first finishes as POP (every prompt position
    before x_N pruned, POP Lab's tokens), the second runs in full and reuses nothing of it.
    Run 9, POP again: it reuses the first request's blocks, which are POP's alone."""
    _, runs, ref, ids = cached
    r, n = runs[8], len(ids["long"])
    assert "error" not in r, r
    assert 0 < r["at_switch"]["pruned_tokens"] < n - 1  # the switch came mid-prefill
    assert r["tokens"] == [ref["long"]["pop"], ref["long"]["full"]]
    assert r["stats"]["pruned_tokens"] == n - 1  # the first request pruned all of its prompt
    assert r["cached"][1] == 0  # the full request took no POP block
    assert ref["long"]["pop"] != ref["long"]["full"]
    after = runs[9]
    assert after["cached"] == [reusable(n)] and after["tokens"] == [ref["long"]["pop"]]
