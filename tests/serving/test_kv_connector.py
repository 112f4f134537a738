"""The POP KV connector (pop_vllm/pop_vllm/connector.py) on a tiny random Llama saved here, in real
vLLM engines run one after another by one driver process (prefill instance, then decode instances):

- the prefill instance (POP, block 2-3 of 6 layers, 16-token batch budget: prompts arrive in
  chunks, some made only of pruned tokens) writes, for every layer (skipped ones included) and
  every prompt position 0..N-2, the K/V POP Lab's `pop` computes, and nothing else;
- a POP decode instance and a stock one load them, compute only x_N and the generated tokens,
  and both give POP Lab's `pop` tokens; a file that is not there, or one written under other
  settings than the decode instance was configured to load, fails that request in one line;
  a request asking for prompt log-probs or setting skip_reading_prefix_cache loads nothing;
- vLLM's ExampleConnector on the same prefill instance loses the skipped layers' K/V (the reason
  the plugin ships its own connector).
"""
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import model_from_hf
from pop_analysis.engine.pop import run_prompt
from pop_vllm.run_setting import RunSetting

from pop_vllm import kv_keys

from tiny_saved import SHAPE, tiny
from vllm_driver import Driver, check_venv, ok, token_major

SKIP = [2, 3]  # layers below and above the block: both kinds of kept layer
BLOCK = 32
LENGTHS = (20, 33, 90)  # shorter than a block; N-1 exactly one block; several blocks, chunked
N_NEW = 6
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256, "block_size": BLOCK,
          "enable_prefix_caching": False, "skip_tokenizer_init": True,
          "max_num_batched_tokens": 16, "max_num_seqs": 4, "seed": 0}
MISSING = {"do_remote_prefill": True, "pop_kv_file": "prefill-0/" + "0" * 40, "pop_kv_tokens": 19}


def _pop_kv(folder: Path, role: str, engine_id: str) -> dict:
    """The connector's config as serve --disaggregated writes it (the producer runs POP)."""
    return kv_keys.transfer_config(role, folder, engine_id, RunSetting(tuple(SKIP), "pop"))


def _jobs(model: Path, prompts, kv: Path, example: Path) -> list[dict]:
    producer = {**ENGINE, "kv_transfer_config": _pop_kv(kv, "kv_producer", "prefill-0")}
    consumer = {**ENGINE, "kv_transfer_config": _pop_kv(kv, "kv_consumer", "decode-0")}
    hand_off = {"prompts": prompts, "max_tokens": 1, "kv": "produce"}
    one = {"prompts": prompts[:1], "max_tokens": 1, "kv": "produce"}
    decode = {"prompts": prompts[:1], "max_tokens": N_NEW}
    return [
        {"model": str(model), "pop": {"skip": SKIP}, "engine": producer,
         "runs": [hand_off, hand_off, hand_off,  # run 2's files stay for the layout check
                  {**one, "prompt_logprobs": 1},  # 3: the full path: a stock file
                  one, one]},
        {"model": str(model), "pop": {"skip": SKIP}, "engine": consumer,
         "runs": [{"prompts": prompts, "max_tokens": N_NEW, "kv": [0, 0]},
                  {**decode, "kv": [MISSING]},
                  {**decode, "kv": [0, 3]},  # 2: a file of other settings than configured
                  {**decode, "kv": [0, 4], "prompt_logprobs": 1},  # 3: loads nothing
                  {**decode, "kv": [0, 5], "skip_reading": True}]},  # 4: loads nothing
        {"model": str(model), "pop": None, "engine": consumer,
         "runs": [{"prompts": prompts, "max_tokens": N_NEW, "kv": [0, 1]}]},
        {"model": str(model), "pop": {"skip": SKIP},
         "engine": {**ENGINE, "kv_transfer_config": {
             "kv_connector": "ExampleConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"shared_storage_path": str(example)}}},
         "runs": [{"prompts": prompts, "max_tokens": 1}]},
    ]


@pytest.fixture(scope="module")
def handed(tmp_path_factory):
    check_venv()
    model, folder = tiny("LlamaForCausalLM", 7, "tiny-llama-kv")
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in LENGTHS]
    kv, example = tmp_path_factory.mktemp("pop_kv"), tmp_path_factory.mktemp("example_kv")
    driver = Driver("kv_connector", _jobs(folder, prompts, kv, example))
    try:
        lm = model_from_hf(model, name="tiny-llama")
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        ref = {v: [run(lm, p, RunSetting(tuple(s), v), cfg).token_ids for p in prompts]
               for v, s in (("pop", SKIP), ("full", ()))}
        ref["kv"] = {v: [_pop_lab_kv(lm, p, v, s) for p in prompts]
                     for v, s in (("pop", SKIP), ("full", ()))}
        with torch.inference_mode():
            logits = lm.model(torch.tensor([prompts[0]])).logits.float()[0]  # (N, V)
            lp = torch.log_softmax(logits[:-1], -1)  # (N-1, V)
            ref["prompt_lp"] = lp.gather(1, torch.tensor(prompts[0][1:])[:, None])[:, 0].tolist()
    finally:
        jobs = driver.results()
    return prompts, jobs, ref, kv, example


def _pop_lab_kv(lm, prompt, variant, skip) -> list:
    """Per layer, POP Lab's (K, V) of positions 0..N-2, (Hkv, N-1, Dh) each."""
    first = run_prompt(lm.adapter, torch.tensor([prompt]), RunSetting(tuple(skip), variant))
    out = []
    for i in range(lm.adapter.n_layers):
        k, v = lm.adapter.cached_kv(first.cache, i)  # (1, Hkv, N, Dh) each
        out.append((k[0, :, :-1], v[0, :, :-1]))
    return out


def test_prefill_instance_hands_off_every_prompt_position_of_every_layer(handed):
    prompts, jobs, ref, kv, _ = handed
    runs = ok(jobs[0])["runs"]
    for i, r in enumerate(runs[:3]):  # the counters add up over the engine's runs
        assert [p["pop_kv_tokens"] for p in r["kv_params"]] == [n - 1 for n in LENGTHS]
        assert r["kv_stats"]["saved_tokens"] == sum(n - 1 for n in LENGTHS) * (i + 1)
    files = sorted((kv / "prefill-0").glob("*.safetensors"))
    assert len(files) == len(prompts)  # run 2's; the decode instances took runs 0 and 1's away
    for params, prompt, pop, full in zip(runs[2]["kv_params"], prompts, ref["kv"]["pop"],
                                         ref["kv"]["full"]):
        with safe_open(str(kv / f"{params['pop_kv_file']}.rank0.safetensors"), "pt") as f:
            assert json.loads(f.metadata()["tokens"]) == prompt[:-1]
            names = sorted(f.keys(), key=lambda s: int(s.split(".")[2]))
            assert len(names) == SHAPE["num_hidden_layers"]
            for i, name in enumerate(names):
                k, v = token_major(f.get_tensor(name), len(prompt) - 1)
                for got, want, other in ((k, pop[i][0], full[i][0]), (v, pop[i][1], full[i][1])):
                    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), \
                        (name, len(prompt), (got - want).abs().max().item())
                    if i in SKIP[1:]:  # from x_f, not x_i: POP's own K/V, not the full model's
                        assert (got - other).abs().max().item() > 1e-2, (name, len(prompt))


def test_pop_and_stock_decode_instances_give_pop_lab_pop(handed):
    prompts, jobs, ref, _, _ = handed
    assert ref["pop"] != ref["full"]  # POP changes these tokens: the comparison can fail
    for job in jobs[1:3]:
        r = ok(job)["runs"][0]
        assert r["tokens"] == ref["pop"]
        stats = r["kv_stats"]
        assert stats["loaded_requests"] == len(prompts) and stats["load_errors"] == 0
        assert stats["loaded_tokens"] == sum(n - 1 for n in LENGTHS) and stats["layers"] == 6
    # the decode side computed x_N and the generated tokens only: nothing of the prompt before
    pop_decode = jobs[1]["runs"][0]["stats"]
    assert pop_decode["pruned_tokens"] == 0 and pop_decode["pop_steps"] == 0


def test_missing_hand_off_fails_the_request(handed):
    """vLLM's kv_load_failure_policy "fail": the request ends with reason error (a 500 over
    HTTP), never a silent recomputation; the engine goes on."""
    _, jobs, _, _, _ = handed
    r = jobs[1]["runs"][1]
    assert r["finish"] == ["error"] and r["tokens"] == [[]], r
    assert r["kv_stats"]["load_errors"] == 1


def test_the_consumer_loads_only_what_it_was_configured_to_load(handed):
    """The decode instance hashes and checks loaded K/V under its configured producer settings,
    never the request's kv_transfer_params: a file the producer wrote under other settings (a
    prompt-log-prob request runs the full path: stock K/V) fails that request in one line."""
    _, jobs, _, kv, _ = handed
    stock_file = jobs[0]["runs"][3]["kv_params"][0]
    assert stock_file["pop_kv_settings"] is None  # the producer ran it on the full path
    r = jobs[1]["runs"][2]
    assert r["finish"] == ["error"] and r["tokens"] == [[]], r
    assert r["kv_stats"]["load_errors"] == 2  # the missing file's, then this one's
    assert not list((kv / "prefill-0").glob(stock_file["pop_kv_file"].split("/")[1] + "*"))


def test_prompt_logprobs_and_the_skip_flag_load_nothing(handed):
    """A decode request asking for prompt log-probs, or setting skip_reading_prefix_cache, loads
    no K/V, whatever its kv_transfer_params say: the prompt is computed here (the full model's
    for prompt log-probs, complete; POP for the other), and the files are removed all the same."""
    prompts, jobs, ref, kv, _ = handed
    runs = jobs[1]["runs"]
    loaded = runs[2]["kv_stats"]["loaded_requests"]
    logprobs, skipping = runs[3], runs[4]
    assert logprobs["tokens"] == [ref["full"][0]] and skipping["tokens"] == [ref["pop"][0]]
    assert logprobs["kv_stats"]["loaded_requests"] == skipping["kv_stats"]["loaded_requests"] \
        == loaded
    got = logprobs["prompt_logprobs"][0]
    assert got[0] is None and None not in got[1:] and len(got) == len(prompts[0])
    assert max(abs(a - b) for a, b in zip(got[1:], ref["prompt_lp"])) < 1e-3
    assert skipping["stats"]["pruned_tokens"] == len(prompts[0]) - 1  # its own POP prefill
    left = {f.name.split(".")[0] for f in (kv / "prefill-0").glob("*.safetensors")}
    assert left == {p["pop_kv_file"].split("/")[1] for p in jobs[0]["runs"][2]["kv_params"]}


def test_example_connector_loses_skipped_layers(handed):
    """vLLM's ExampleConnector saves from the per-layer attention hook, in a request's first
    step: a first chunk made only of pruned tokens never reaches the skipped layers' hook."""
    _, jobs, _, _, example = handed
    ok(jobs[3])
    saved = [{p.stem for p in d.glob("*.safetensors")} for d in example.iterdir() if d.is_dir()]
    assert saved, "ExampleConnector saved nothing"
    skipped = {f"model.layers.{i}.self_attn.attn" for i in SKIP}
    assert any(not (skipped & layers) and layers for layers in saved), saved
