"""Run jobs on vLLM engines, one after another in one process, and print the results as JSON
(the engine tests spawn this in the serving venv; one process saves vLLM's import per engine).
A one-rank engine runs inside this process (vLLM's in-process engine core and "uni" executor):
two process starts fewer per engine, the same model code and plugin. Parallel engines (tensor or
pipeline) keep vLLM's worker processes, one per rank.

    python -m pop_vllm.driver JOBS.json

JOBS: {"cache": DIR, "kv_cache_gib": 1, "jobs": [JOB, ...]}
JOB:  {"model": DIR, "engine": {LLM keyword arguments},
       "pop": {"skip": [...], "variant": "pop", "repair": PATH} | null (null: the stock
       architecture; repair only for pop_repair),
       "runs": [{"set": {"skip": [...], "variant": ..., "repair": PATH} (optional run-time
                 switch), "prompts": [[ids], ...], "max_tokens": N, "batched": true,
                 "logprobs": K, "prompt_logprobs": K or [K | null per prompt] (optional),
                 "kv": "produce" | [params per prompt] | [job, run] (optional, KV connector
                 engines: ask for a hand-off, or pass a producer run's kv_transfer_params),
                 "skip_reading": true | false (SamplingParams.skip_reading_prefix_cache),
                 "chat": [[ids], ...] (instead of prompts: turn k's prompt is turn k-1's prompt,
                 its answer and these ids),
                 "switch_in_flight": {"set": {...}} (instead of prompts: the prompts are added,
                 the switch is sent once the engine has pruned some of their tokens, then the
                 "after" prompts are added; every request runs to its end)}]}
       "multiprocess": true runs a one-rank engine's core in its own process (vLLM's default:
       a run-time switch can then wait for the requests in flight).
       "engine" may hold "kv_transfer_config": {...} (vLLM's KVTransferConfig fields).
Prints one line "POP_DRIVER_RESULT " + JSON: {"jobs": [{"ok": true, "start_s": ..., "runs":
[{"tokens": [[...]], "stats": {...} | null, "preemptions": N | null, "cached": [...],
"finish": [...], "kv_params": [...], "kv_stats": {...} | null, "prompts": [[...]] (chat runs),
"logprobs": [[...]], "prompt_logprobs": [[null, ...]] (log-probs of the generated / prompt tokens
themselves, when asked)}]} or {"ok": false,
"error": "one line"}, ...]}. A run whose switch or generation fails gives {"error": "one line"}
and the job goes on with its next run. "preemptions" is vLLM's vllm:num_preemptions counter
(engines started with disable_log_stats=False; null otherwise).
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

from .engine_env import BIND_ENV, KV_STATS, MULTIPROCESSING_ENV, RESET_STATS, STATS, SWITCH

MARK = "POP_DRIVER_RESULT "


def one_line(exc: BaseException) -> str:
    """The root cause's first line: vLLM's config is a pydantic dataclass, so an error of a config
    hook (the plugin's checks) arrives wrapped in a ValidationError that carries the original."""
    for err in getattr(exc, "errors", lambda: [])() if hasattr(exc, "errors") else []:
        original = (err.get("ctx") or {}).get("error")
        if isinstance(original, BaseException):
            return one_line(original)
    inner = exc
    while True:  # the chain Python would print: a `raise ... from None` ends it
        nxt = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
        if nxt is None:
            break
        inner = nxt
    for e in (inner, exc):
        text = str(e).strip().splitlines()
        if text:
            return f"{type(e).__name__}: {text[0]}"
    return type(exc).__name__


def run_job(job: dict, done: list | None = None) -> dict:
    from vllm import LLM, SamplingParams

    from .run_setting import RunSetting
    from .settings import overrides

    engine = dict(job.get("engine", {}))
    world = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
    _bind_ranks(world)
    _in_process(engine, world, job.get("multiprocess", False))
    if "kv_transfer_config" in engine:
        from vllm.config import KVTransferConfig

        engine["kv_transfer_config"] = KVTransferConfig(**engine["kv_transfer_config"])
    pop = job.get("pop")
    if pop is not None:
        engine["hf_overrides"] = overrides(job.get("architecture", "LlamaForCausalLM"),
                                           RunSetting(**pop))
    t0 = time.perf_counter()
    llm = LLM(job["model"], **engine)
    out = {"ok": True, "start_s": round(time.perf_counter() - t0, 2), "runs": []}
    try:
        for run in job.get("runs", []):
            try:
                out["runs"].append(_run(llm, run, pop is not None, SamplingParams, done or []))
            except Exception as exc:  # a refused switch: one line, the engine carries on
                out["runs"].append({"error": one_line(exc)})
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    return out


def _bind_ranks(world: int, _auto=os.environ.get(BIND_ENV)) -> None:
    """Each rank of a parallel engine on its own cores; a one-rank engine as the caller set it."""
    from .engine_env import rank_cpus

    if world > 1:
        os.environ[BIND_ENV] = rank_cpus(world)
    elif _auto is None:
        os.environ.pop(BIND_ENV, None)
    else:
        os.environ[BIND_ENV] = _auto


def _in_process(engine: dict, world: int, multiprocess: bool = False) -> None:
    """One rank: engine core and worker in this process (read by vLLM when the engine starts)."""
    os.environ[MULTIPROCESSING_ENV] = "0" if world == 1 and not multiprocess else "1"
    if world == 1:
        engine.setdefault("distributed_executor_backend", "uni")


def _run(llm, run: dict, is_pop: bool, SamplingParams, done: list) -> dict:
    if "set" in run:
        llm.collective_rpc(SWITCH, args=(run["set"],))
    if is_pop:
        llm.collective_rpc(RESET_STATS)
    if "chat" in run:
        return _chat(llm, run, is_pop, SamplingParams)
    if "switch_in_flight" in run:
        return _switch_in_flight(llm, run, SamplingParams)
    prompts = [{"prompt_token_ids": p} for p in run["prompts"]]
    asked = run.get("prompt_logprobs")
    per_prompt = asked if isinstance(asked, list) else [asked] * len(prompts)
    kv = _kv_params(run.get("kv"), len(prompts), done)
    params = [SamplingParams(max_tokens=run.get("max_tokens", 8), temperature=0.0, ignore_eos=True,
                             logprobs=run.get("logprobs"), prompt_logprobs=k,
                             skip_reading_prefix_cache=run.get("skip_reading"),
                             extra_args=None if p is None else {"kv_transfer_params": p})
              for k, p in zip(per_prompt, kv)]
    if run.get("batched", True):
        res = llm.generate(prompts, params, use_tqdm=False)
    else:
        res = [llm.generate([p], [s], use_tqdm=False)[0] for p, s in zip(prompts, params)]
    out = {"tokens": [list(r.outputs[0].token_ids) for r in res],
           "stats": llm.collective_rpc(STATS)[0] if is_pop else None,
           "preemptions": _preemptions(llm), "cached": [r.num_cached_tokens for r in res],
           "finish": [r.outputs[0].finish_reason for r in res],
           "kv_params": [r.kv_transfer_params for r in res],
           "kv_stats": llm.collective_rpc(KV_STATS)[0]}
    if run.get("logprobs") is not None:
        out["logprobs"] = [_own(r.outputs[0].logprobs, r.outputs[0].token_ids) for r in res]
    if asked is not None:
        out["prompt_logprobs"] = [None if r.prompt_logprobs is None else
                                  _own(r.prompt_logprobs, r.prompt_token_ids) for r in res]
    return out


def _own(per_position, ids) -> list:
    """The log-prob of each token itself from vLLM's per-position {token: Logprob} (None where
    vLLM gives none: the first prompt position)."""
    return [None if d is None else d[t].logprob for d, t in zip(per_position, ids)]


def _kv_params(kv, n: int, done: list) -> list:
    """Per prompt, the kv_transfer_params to send (None: none)."""
    if kv is None:
        return [None] * n
    if kv == "produce":
        return [{"do_remote_decode": True}] * n
    if len(kv) == 2 and all(isinstance(i, int) for i in kv):  # [job, run] of this driver
        return list(done[kv[0]]["runs"][kv[1]]["kv_params"])
    return list(kv)


def _chat(llm, run: dict, is_pop: bool, SamplingParams) -> dict:
    """A conversation, one request per turn: each turn's prompt extends the last one with its
    answer and the next message (what a chat client sends)."""
    params = SamplingParams(max_tokens=run.get("max_tokens", 8), temperature=0.0, ignore_eos=True)
    prompt, prompts, tokens, cached = [], [], [], []
    for message in run["chat"]:
        prompt = prompt + (tokens[-1] if tokens else []) + list(message)
        r = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        prompts.append(prompt)
        tokens.append(list(r.outputs[0].token_ids))
        cached.append(r.num_cached_tokens)
    return {"tokens": tokens, "prompts": prompts, "cached": cached,
            "stats": llm.collective_rpc(STATS)[0] if is_pop else None,
            "preemptions": _preemptions(llm)}


def _switch_in_flight(llm, run: dict, SamplingParams) -> dict:
    """Requests in flight when a run-time switch arrives, and requests after it (one engine,
    added in this order: the first prompts, the switch, the "after" prompts)."""
    engine, spec = llm.llm_engine, run["switch_in_flight"]
    params = SamplingParams(max_tokens=run.get("max_tokens", 8), temperature=0.0, ignore_eos=True,
                            logprobs=run.get("logprobs"))
    first, after = run["prompts"], spec.get("after", [])
    for i, p in enumerate(first):
        engine.add_request(f"first-{i}", {"prompt_token_ids": p}, params)
    stepped = os.environ.get(MULTIPROCESSING_ENV) == "0"  # by this caller
    end, seen = time.monotonic() + 300, None
    while seen is None or seen["pruned_tokens"] == 0:  # their prefill has begun
        if time.monotonic() > end:
            raise TimeoutError("the first requests' prefill did not begin within 300 s")
        if stepped and seen is not None:
            engine.step()
        seen = llm.collective_rpc(STATS)[0]
    out = {"at_switch": seen}
    try:
        out["switched"] = llm.collective_rpc(SWITCH, args=(spec["set"],))
    except Exception as exc:  # refused: the requests in flight are aborted, the job goes on
        out["error"] = one_line(exc)
        engine.abort_request([f"first-{i}" for i in range(len(first))])
        while engine.has_unfinished_requests():
            engine.step()
        return out
    for i, p in enumerate(after):
        engine.add_request(f"after-{i}", {"prompt_token_ids": p}, params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    order = [f"first-{i}" for i in range(len(first))] + [f"after-{i}" for i in range(len(after))]
    res = [done[r] for r in order]
    out.update(tokens=[list(r.outputs[0].token_ids) for r in res],
               cached=[r.num_cached_tokens for r in res],
               stats=llm.collective_rpc(STATS)[0])
    if run.get("logprobs") is not None:
        out["logprobs"] = [_own(r.outputs[0].logprobs, r.outputs[0].token_ids) for r in res]
    return out


def _preemptions(llm) -> int | None:
    """vLLM's cumulative preemption counter (None when the engine keeps no statistics)."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - statistics are off (disable_log_stats=True)
        return None
    found = [m.value for m in metrics if m.name == "vllm:num_preemptions"]
    return int(sum(found)) if found else None


def _exit_on_term(*_):
    raise SystemExit(143)  # so the engines' finally blocks shut their processes down


def main(argv: list[str]) -> int:
    import signal

    signal.signal(signal.SIGTERM, _exit_on_term)
    if len(argv) != 1:
        print("usage: python -m pop_vllm.driver JOBS.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    from .engine_env import apply

    apply(spec["cache"], kv_cache_gib=spec.get("kv_cache_gib", 1), threads=spec.get("threads"))
    results = []
    for job in spec["jobs"]:
        try:
            results.append(run_job(job, results))
        except Exception as exc:  # one line back to the caller; the engine log has the rest
            results.append({"ok": False, "error": one_line(exc)})
    print(MARK + json.dumps({"jobs": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
