"""Run jobs on one vLLM engine and print the results as one JSON line (used by the tests).

    python -m pop_vllm.driver JOB.json        # in the serving venv

JOB: {"model": DIR, "cache": DIR, "engine": {LLM keyword arguments},
      "pop": {"skip": [...], "variant": "pop"} | null (null: the stock architecture),
      "runs": [{"set": {"skip": [...], "variant": ...} (optional run-time switch),
                "prompts": [[ids], ...], "max_tokens": N, "batched": true}]}
Output: {"ok": true, "runs": [{"tokens": [[...], ...], "stats": {...} | null}], "start_s": ...}
or {"ok": false, "error": "one line"}; the exit status is 0 either way once the JSON is printed.
"""
from __future__ import annotations

import json
import sys
import time


def _one_line(exc: BaseException) -> str:
    """The root cause's message, first line (vLLM wraps config errors)."""
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__
    for e in (seen, exc):
        text = str(e).strip().splitlines()
        if text:
            return f"{type(e).__name__}: {text[0]}"
    return type(exc).__name__


def run_job(job: dict) -> dict:
    from .engine_env import apply

    apply(job["cache"], kv_cache_gib=job.get("kv_cache_gib", 1.0), threads=job.get("threads"))
    from vllm import LLM, SamplingParams

    from .settings import overrides

    engine = dict(job.get("engine", {}))
    if job.get("pop") is not None:
        arch = job.get("architecture", "LlamaForCausalLM")
        engine["hf_overrides"] = overrides(arch, job["pop"].get("skip", ()),
                                           job["pop"].get("variant", "pop"))
    t0 = time.perf_counter()
    llm = LLM(job["model"], **engine)
    out = {"ok": True, "start_s": time.perf_counter() - t0, "runs": []}
    for run in job.get("runs", []):
        if "set" in run:
            llm.collective_rpc("pop_set", args=(run["set"].get("skip", ()),
                                                      run["set"].get("variant", "pop")))
        if job.get("pop") is not None:
            llm.collective_rpc("pop_reset_stats")
        params = SamplingParams(max_tokens=run.get("max_tokens", 8), temperature=0.0,
                                ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in run["prompts"]]
        if run.get("batched", True):
            res = llm.generate(prompts, params, use_tqdm=False)
            tokens = [list(r.outputs[0].token_ids) for r in res]
        else:
            tokens = [list(llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids)
                      for p in prompts]
        stats = llm.collective_rpc("pop_stats")[0] if job.get("pop") is not None else None
        out["runs"].append({"tokens": tokens, "stats": stats})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(json.dumps({"ok": False, "error": "usage: python -m pop_vllm.driver JOB.json"}))
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        out = run_job(job)
    except Exception as exc:  # one line back to the caller; the engine log has the rest
        out = {"ok": False, "error": _one_line(exc)}
    print("POP_DRIVER_RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
