"""One switchable POP engine on 127.0.0.1 (SmolLM2-135M, skip 20-29), as the Serve page and
serve-bench start it (pop_analysis.serving.session.Serving, engines="one"), over HTTP:

- the run-time full/POP switch goes through the plugin's guarded control route with the secret
  only this process holds (in the engine's environment, never on a command line or in the log);
  another local client, in its own process without the secret, gets 401/404 on the control route,
  on vLLM's development routes and on every other route that changes the engine, and the engine
  keeps serving with its settings unchanged;
- prompt log-probs (`prompt_logprobs`, and `echo` with `logprobs`) on the engine while it runs pop
  or pop_no_boundary are the full model's: equal to the same engine switched to full and to POP Lab's
  own full model within 1e-3; generated-token log-probs are allowed and are the served model's
  (POP Lab's pop for a POP request);
- last, the engine's lifecycle: its start reported progress up to ready, its command line carries
  the offline, loopback and no-prefix-cache settings, and its front end killed mid-run is noticed
  (one line), after which stop() leaves no process.
"""
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from pop_analysis.engine.generate import encode
from pop_analysis.engine.pop import run_prompt, teacher_force
from pop_analysis.serving import venv
from pop_analysis.serving.server import group_members
from pop_analysis.serving.session import Serving
from pop_analysis.serving.spec import spec_for
from pop_analysis.serving.venv import ServingError
from pop_analysis.speed import procs
from pop_vllm.engine_env import CONTROL_ROUTE, CONTROL_TOKEN_ENV
from pop_vllm.guards import is_open
from pop_vllm.run_setting import RunSetting

from vllm_driver import wait_until

SKIP = tuple(range(20, 30))
TEXT = "The quick brown fox jumps over the lazy dog because it wanted to see the other side."
TOL = 1e-3
# Routes that change an engine: vLLM's development routes (off: 404) and the stock ones the guard
# closes (401): data-parallel scaling, profiling, LoRA loading, aborts.
CHANGING = ["/collective_rpc", "/sleep", "/wake_up", "/reset_prefix_cache", "/reset_mm_cache",
            "/server_info", "/is_sleeping", "/pause", "/resume", "/scale_elastic_ep",
            "/start_profile", "/stop_profile", "/v1/load_lora_adapter", "/abort_requests",
            CONTROL_ROUTE]
OUTSIDER = """
import json, sys, urllib.request, urllib.error
url, routes = sys.argv[1], json.loads(sys.argv[2])
out = {}
for route, headers in routes:
    body = json.dumps({"method": "pop_set", "args": [{"skip": [], "variant": "full"}],
                       "new_data_parallel_size": 2,
                       "level": 1}).encode()
    req = urllib.request.Request(url + route, body, {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            out[route + str(headers)] = r.status
    except urllib.error.HTTPError as e:
        out[route + str(headers)] = e.code
print(json.dumps(out))
"""

# Every route the running server declares (its own /openapi.json), path parameters filled in, and
# routes it does not know: the status each answers a client without the secret.
EVERY_ROUTE = """
import json, re, sys, urllib.request, urllib.error
url, extra = sys.argv[1], json.loads(sys.argv[2])
with urllib.request.urlopen(url + "/openapi.json", timeout=60) as r:
    declared = [(m.upper(), re.sub(r"[{][^}]*[}]", "x", p)) for p, ops in json.load(r)["paths"].items()
                for m in ops]
out = []
for method, path in declared + [tuple(e) for e in extra]:
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    req = urllib.request.Request(url + path, body, {"Content-Type": "application/json"},
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            out.append([method, path, r.status])
    except urllib.error.HTTPError as e:
        out.append([method, path, e.code])
print(json.dumps(out))
"""
UNKNOWN = [["POST", "/v1/set_adapter"], ["DELETE", "/v1/models/x"], ["PUT", "/v1/completions"],
           ["POST", "/v1/models"], ["POST", "/v2/anything"], ["GET", "/v1/completions/"]]

STARTED: list[tuple] = []  # the engine's start progress: (done, total, message) as reported


@pytest.fixture(scope="module")
def serving(embedded):
    try:
        venv.python()
    except ServingError as e:
        pytest.fail(f"{e} (the serving tests need it: bash {venv.INSTALL_SCRIPT})")
    spec = spec_for("smollm2-135m", RunSetting(SKIP), max_model_len=1024, kv_cache_gib=1)
    with Serving(spec, engines="one", progress=lambda *step: STARTED.append(step)) as s:
        yield s


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def variant_now(engine) -> str:
    return engine.control("pop_stats")[0]["variant"]


def test_another_local_client_cannot_change_the_engine(serving):
    engine = serving.engines["pop"]
    serving.generate("pop", "Hello", 2)  # the engine runs pop now
    routes = [[r, {}] for r in CHANGING] + [[CONTROL_ROUTE, {"Authorization": "Bearer guessed"}],
                                            ["/collective_rpc", {"Authorization": "Bearer guessed"}]]
    p = subprocess.run([sys.executable, "-c", OUTSIDER, engine.url, json.dumps(routes)],
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != CONTROL_TOKEN_ENV})
    codes = json.loads(p.stdout)
    assert all(c in (401, 403, 404) for c in codes.values()), codes
    assert codes[CONTROL_ROUTE + "{}"] == 401 and codes["/scale_elastic_ep{}"] == 401
    assert codes["/collective_rpc{}"] in (401, 404)
    # still serving, still pop: nothing the outsider sent reached the workers
    assert variant_now(engine) == "pop"
    out = post(f"{engine.url}/v1/completions", {"model": serving.spec.name, "prompt": "The sky is",
                                                "max_tokens": 2, "temperature": 0})
    assert out["choices"][0]["text"]
    assert engine.alive()


def test_the_guard_opens_only_its_allowlist_of_the_real_servers_routes(serving):
    """Every (method, path) the real vLLM server declares, and some it does not: a client without
    the secret gets 401 unless the pair is on the guard's allowlist (exact match), and the open
    ones are answered by vLLM (a 4xx for an empty body, never 401)."""
    engine = serving.engines["pop"]
    p = subprocess.run([sys.executable, "-c", EVERY_ROUTE, engine.url, json.dumps(UNKNOWN)],
                       capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != CONTROL_TOKEN_ENV})
    seen = json.loads(p.stdout)
    wrong = [(m, path, code) for m, path, code in seen if (code == 401) == is_open(m, path)]
    assert not wrong, wrong
    closed = {(m, path) for m, path, code in seen if code == 401}
    declared_closed = closed - {tuple(u) for u in UNKNOWN}  # 8 routes of vLLM 0.32 here
    assert len(declared_closed) >= 5 and ("POST", "/generative_scoring") in closed, sorted(closed)
    assert {("POST", "/v1/completions"), ("GET", "/v1/models")} <= {
        (m, path) for m, path, _ in seen} - closed
    assert variant_now(engine) == "pop" and engine.alive()


def test_the_secret_is_in_no_command_line_and_no_log(serving):
    engine = serving.engines["pop"]
    secret = engine._secret
    assert len(secret) >= 40
    assert secret not in engine.command_line and secret not in engine.log_text()
    assert f'{CONTROL_TOKEN_ENV}="${CONTROL_TOKEN_ENV}"' in engine.command_line
    assert "VLLM_SERVER_DEV_MODE" not in engine.command_line and "--middleware" in engine.command_line
    for pid in procs.pids():  # every process's command line is readable by every local user
        try:
            assert secret not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
    for pid in engine.pids():  # the environment is readable by its owner only
        assert os.stat(f"/proc/{pid}/environ").st_mode & 0o777 == 0o400


def test_the_switch_works_with_the_secret(serving):
    engine = serving.engines["pop"]
    assert serving.generate("full", "Hello", 2)["text"] is not None
    assert variant_now(engine) == "full"
    serving.generate("pop", "Hello", 2)
    stats = engine.control("pop_stats")[0]
    assert stats["variant"] == "pop" and stats["skip"] == list(SKIP)
    with pytest.raises(ServingError, match="HTTP 400.*out of range"):  # a bad setting: one line
        engine.control("pop_set", [RunSetting([40]).as_config()])
    assert variant_now(engine) == "pop"


def prompt_logprobs(url: str, model: str, ids: list[int], echo: bool) -> tuple[list, list]:
    """(log-prob of each prompt token but the first, of each generated token) from one greedy
    completion of a token-id prompt, through echo + logprobs or vLLM's prompt_logprobs."""
    body = {"model": model, "prompt": [ids], "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "logprobs": 1}
    body.update({"echo": True} if echo else {"prompt_logprobs": 1})
    choice = post(f"{url}/v1/completions", body)["choices"][0]
    if echo:  # the echoed prompt's log-probs first, then the generated tokens'
        lp = choice["logprobs"]["token_logprobs"]
        return lp[1:len(ids)], lp[len(ids):]
    prompt = [d[str(t)]["logprob"] for d, t in zip(choice["prompt_logprobs"][1:], ids[1:])]
    return prompt, choice["logprobs"]["token_logprobs"]


@torch.inference_mode()
def full_model_logprobs(lm, ids: list[int]) -> list[float]:
    logits = lm.model(torch.tensor([ids])).logits.float()[0]  # (N, V)
    lp = torch.log_softmax(logits[:-1], -1)  # (N-1, V)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


@torch.inference_mode()
def pop_lab_generated_logprobs(lm, ids, variant, skip, tokens) -> list[float]:
    """POP Lab's log-probs of `tokens` generated after prompt `ids` under `variant`."""
    first = run_prompt(lm.adapter, torch.tensor([ids]), RunSetting(skip, variant))
    out = [torch.log_softmax(first.logits[0], -1)[tokens[0]].item()]
    if len(tokens) > 1:
        logits = teacher_force(lm.adapter, torch.tensor([tokens[:-1]]), first.cache, first.position)
        lp = torch.log_softmax(logits[0], -1)  # (T-1, V)
        out += lp.gather(1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()
    return out


def close(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_prompt_logprobs_on_a_pop_engine_are_the_full_models(serving, embedded):
    engine, name = serving.engines["pop"], serving.spec.name
    ids = encode(embedded, TEXT, raw=True)
    model_lp = full_model_logprobs(embedded, ids)
    serving.generate("full", "Hello", 1)  # switched to full: the engine's own reference
    full = {echo: prompt_logprobs(engine.url, name, ids, echo) for echo in (True, False)}
    assert close(full[True][0], model_lp) < TOL
    for variant in ("pop", "pop_no_boundary"):
        engine.switch(RunSetting(SKIP, variant))
        engine.control("pop_reset_stats")
        for echo in (True, False):
            prompt, generated = prompt_logprobs(engine.url, name, ids, echo)
            assert close(prompt, full[echo][0]) < TOL and close(prompt, model_lp) < TOL
            assert close(generated, full[echo][1]) < TOL  # the request ran the full path
        stats = engine.control("pop_stats")[0]
        assert stats["variant"] == variant and stats["pruned_tokens"] == 0
        assert stats["logprob_full_tokens"] >= 2 * (len(ids) - 1)
    engine.switch(RunSetting(SKIP))


def test_generated_logprobs_on_a_pop_engine_are_pops(serving, embedded):
    """logprobs without echo: the request is served as POP (its prompt pruned), and each
    generated token's log-prob is the one POP computes for it (POP Lab's pop)."""
    engine, name = serving.engines["pop"], serving.spec.name
    ids = encode(embedded, TEXT, raw=True)
    serving.generate("pop", "Hello", 1)
    engine.control("pop_reset_stats")
    choice = post(f"{engine.url}/v1/completions",
                  {"model": name, "prompt": [ids], "max_tokens": 4, "temperature": 0,
                   "ignore_eos": True, "return_token_ids": True, "logprobs": 1})["choices"][0]
    tokens, lp = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert engine.control("pop_stats")[0]["pruned_tokens"] == len(ids) - 1
    assert close(lp, pop_lab_generated_logprobs(embedded, ids, "pop", SKIP, tokens)) < TOL


def test_stop_and_death_mid_run(serving):
    """Last in this module: it kills the engine's front end."""
    engine = serving.engines["pop"]
    done, total, message = STARTED[-1]
    assert done == total and message.endswith("ready"), STARTED[-3:]
    cmd = engine.command_line
    for part in ("VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1", "VLLM_HOST_IP=127.0.0.1",
                 "HF_HUB_OFFLINE=1", "vllm.entrypoints.openai.api_server", "--host 127.0.0.1",
                 "--no-enable-prefix-caching"):  # every engine, stock ones too: fair comparisons
        assert part in cmd
    out = post(f"{engine.url}/v1/completions", {"model": serving.spec.name, "max_tokens": 4,
                                                "prompt": "The capital of France is",
                                                "temperature": 0})
    assert out["choices"][0]["text"].strip()
    assert engine.rss_bytes() > 100 * 2**20
    # Kill the front end (the watchdog's child): the engine dies mid-run.
    front = [p for p in procs.children(engine.proc.pid) if p in group_members(engine.proc.pid)]
    os.kill(front[0], signal.SIGKILL)
    wait_until(lambda: not engine.alive(), 30, "the wrapper did not notice")
    with pytest.raises(ServingError) as e:
        engine.check()
    text = str(e.value)
    assert "the engine died" in text and "\n" not in text
    serving.stop()
    assert not group_members(engine.proc.pid)
