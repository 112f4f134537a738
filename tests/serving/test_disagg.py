"""Prefill/decode disaggregation through `serve --disaggregated` on the embedded SmolLM2-135M
(skip 20-29): a POP prefill instance on core 0, a POP decode instance on core 1, vLLM's router
between them, the POP KV connector handing the K/V over through files.

- the CLI prints the topology and the exact commands it ran;
- greedy token ids over HTTP equal POP Lab's `pop` for a prompt shorter than a block, one of
  several blocks and a batch of mixed lengths sent at once, and the decode instance took every
  position before x_N from the hand-off (its own counter of externally loaded tokens);
- prompt log-probs (`prompt_logprobs`, `echo`) through the router are complete and the stock
  model's: the decode side loads nothing for them and computes the prompt on the full path;
- the prefill instance killed mid-request: the client gets one clear error, the CLI exits with
  one line, and no process of the topology is left.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.serving.server import group_members
from pop_analysis.speed.procs import children
from pop_vllm.run_setting import RunSetting

from vllm_driver import check_venv, wait_until

ROOT = Path(__file__).resolve().parents[2]
TAIL = list(range(20, 30))
N_NEW = 8
TEXTS = ["What is the capital of France?",  # 8 tokens: shorter than a block of 32
         "Write a haiku about autumn leaves.",
         "Explain in one sentence why the sky is blue.",
         "A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes? "
         "Explain each step of the calculation carefully, then give the answer in hours and "
         "minutes. " * 3]  # several blocks
LONG = "Describe the history of the river Seine, its sources, towns and bridges in detail. " * 40


def post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(f"{url}/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def token_ids(url: str, prompt: list[int]) -> list[int]:
    out = post(url, {"model": "smollm2-135m", "prompt": prompt, "max_tokens": N_NEW,
                     "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    return out["choices"][0]["token_ids"]


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln.startswith(name)]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


@pytest.fixture(scope="module")
def topology(embedded, tmp_path_factory):
    check_venv()
    kv_dir = tmp_path_factory.mktemp("kv")
    p = subprocess.Popen([sys.executable, "-m", "pop_analysis", "serve", "--disaggregated",
                          "--skip", "20-29", "--port", "0", "--max-model-len", "1024",
                          "--prefill-cpus", "0", "--decode-cpus", "1", "--kv-dir", str(kv_dir),
                          "--json"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        prompts = [encode(embedded, t) for t in TEXTS]  # while the instances start
        ref = {v: [run(embedded, ids, RunSetting(tuple(s), v), cfg).token_ids for ids in prompts]
               for v, s in (("pop", TAIL), ("full", ()))}
        line = p.stdout.readline()
        if not line:
            pytest.fail(f"serve --disaggregated exited: {p.stderr.read()[-2000:]}")
        yield p, json.loads(line), prompts, ref, kv_dir
    finally:
        p.kill()
        p.wait()


def test_cli_prints_topology_and_commands(topology):
    _, info, _, _, kv_dir = topology
    assert info["url"].startswith("http://127.0.0.1:")
    text = "\n".join(info["topology"])
    for words in ("prefill pool", "decode pool", "proxy: vllm-router", "PopKVConnector"):
        assert words in text, text
    m = info["members"]
    assert "taskset -c 0 " in m["prefill"]["command"] and "taskset -c 1 " in m["decode"]["command"]
    for side, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        assert "PopLlamaForCausalLM" in m[side]["command"] and role in m[side]["command"]
        assert "--kv-transfer-config" in m[side]["command"] and str(kv_dir) in m[side]["command"]
    assert "vllm_router.launch_router --vllm-pd-disaggregation" in m["proxy"]["command"]
    assert info["folder"].startswith(str(kv_dir))


def test_disaggregated_tokens_equal_pop_lab_pop(topology):
    _, info, prompts, ref, _ = topology
    assert ref["pop"] != ref["full"]  # POP changes these tokens: the comparison can fail
    decode = info["members"]["decode"]["url"]
    before = metric(decode, "vllm:external_prefix_cache_hits_total")
    assert token_ids(info["url"], prompts[0]) == ref["pop"][0]  # shorter than a block
    assert token_ids(info["url"], prompts[-1]) == ref["pop"][-1]  # several blocks
    with ThreadPoolExecutor(len(prompts)) as pool:  # mixed lengths at once: batched steps
        assert list(pool.map(lambda q: token_ids(info["url"], q), prompts)) == ref["pop"]
    moved = sum(len(q) - 1 for q in [prompts[0], prompts[-1], *prompts])  # x_1..x_{N-1} each
    wait_until(lambda: metric(decode, "vllm:external_prefix_cache_hits_total") - before >= moved,
               30, "the decode instance did not load every position before x_N")
    assert metric(decode, "vllm:external_prefix_cache_hits_total") - before == moved
    folder = Path(info["folder"])
    assert not list(folder.rglob("*.safetensors"))  # each decode request removed its file


@torch.inference_mode()
def full_model_logprobs(lm, ids: list[int]) -> list[float]:
    """The stock model's log-prob of each prompt token after the first (POP Lab's full model)."""
    logits = lm.model(torch.tensor([ids])).logits.float()[0]  # (N, V)
    lp = torch.log_softmax(logits[:-1], -1)  # (N-1, V)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def test_prompt_logprobs_through_the_topology_are_complete_and_the_stock_models(topology, embedded):
    """A request asking for prompt log-probs loads nothing on the decode side (its positions
    before x_N would have no log-probs): the decode instance computes the whole prompt on the
    full path, so every prompt log-prob is there and equals the stock model's."""
    _, info, prompts, _, _ = topology
    decode = info["members"]["decode"]["url"]
    ids = prompts[-1]  # several blocks
    want = full_model_logprobs(embedded, ids)
    for echo in (False, True):
        before = metric(decode, "vllm:external_prefix_cache_hits_total")
        body = {"model": "smollm2-135m", "prompt": ids, "max_tokens": 2, "temperature": 0,
                "ignore_eos": True, "logprobs": 1}
        body.update({"echo": True} if echo else {"prompt_logprobs": 1})
        choice = post(info["url"], body)["choices"][0]
        if echo:
            got = choice["logprobs"]["token_logprobs"][1:len(ids)]
        else:
            got = [d[str(t)]["logprob"] for d, t in zip(choice["prompt_logprobs"][1:], ids[1:])]
            assert choice["prompt_logprobs"][0] is None and len(choice["prompt_logprobs"]) == len(ids)
        assert len(got) == len(ids) - 1 and None not in got, got
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3
        assert metric(decode, "vllm:external_prefix_cache_hits_total") == before  # loaded nothing
    folder = Path(info["folder"])
    wait_until(lambda: not list(folder.rglob("*.safetensors")), 30,
               "the decode instance did not remove the prefill's unused file")


def test_prefill_killed_mid_request_one_error_no_orphan(topology):
    """Six long prompts at once keep the prefill instance (one core) busy for seconds; it is
    killed while they are in it. Those in it get one error line from the proxy (HTTP 500),
    those already in decode an answer or a closed connection when the CLI stops; none hangs."""
    p, info, _, _, _ = topology
    prefill = info["members"]["prefill"]
    got = []

    def ask():
        try:
            post(info["url"], {"model": "smollm2-135m", "prompt": LONG, "max_tokens": 4,
                               "temperature": 0}, timeout=120)
            got.append(("ok", ""))
        except urllib.error.HTTPError as e:  # the proxy's answer: the prefill failed
            got.append((e.code, e.read().decode()))
        except OSError as e:  # the topology stopped under a request already in decode
            got.append(("closed", str(e)))

    clients = [threading.Thread(target=ask) for _ in range(6)]
    for c in clients:
        c.start()
    busy = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    wait_until(lambda: sum(metric(prefill["url"], m) for m in busy) > 0, 60,
               "the requests never reached the prefill instance")
    front = [c for c in children(prefill["pgid"]) if c in group_members(prefill["pgid"])]
    os.kill(front[0], signal.SIGKILL)
    for c in clients:
        c.join(timeout=150)
    assert len(got) == len(clients), "a client hung"
    errors = [(code, body) for code, body in got if isinstance(code, int)]
    assert errors, got
    for code, body in errors:
        assert code >= 500 and body.strip() and "\n" not in body.strip(), (code, body)
    p.wait(timeout=60)
    err = p.stderr.read().strip().splitlines()
    assert p.returncode == 1 and "the prefill instance died" in err[-1], err[-3:]
    for member in info["members"].values():
        wait_until(lambda: not group_members(member["pgid"]), 30, "a process outlived the CLI")
