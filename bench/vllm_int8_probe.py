"""Does vLLM's CPU build serve POP Lab's int8 weights? (docs/serving.md, "An int8 prefill pool")

    python bench/vllm_int8_probe.py --model smollm2-135m --prompts 8

Writes the model's compressed-tensors W8A8 copy (serving/int8_checkpoint.py: every decoder layer
in int8, POP Lab's own int8 weights and scales) to a temporary folder, then, per prompt (GSM8K test
questions), the first token's top-5 log-probabilities and 12 greedy tokens from:
- vLLM on the fp32 model, and on the int8 copy with vLLM's own kernel choice (no plugin loaded)
  and with the POP plugin's (pop_vllm/int8_kernel.py: the oneDNN int8 kernel for an fp32 model;
  the `serve` stage, run in the serving venv, one engine per run);
- POP Lab on the fp32 model, with uniform int8 (prompt, x_N and decode) and with prefill-only
  int8 (x_N and decode in fp32).
Raw output: bench/raw/vllm_int8_probe/. No timing: a question of what runs and what it computes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
N_NEW, TOP = 12, 5
MARK = "PROBE_RESULT "  # the serve stage's one result line (vLLM writes to stdout too)


def serve(args) -> None:
    """In the serving venv: one in-process engine over args.path, greedy with top-5 log-probs."""
    from pop_vllm.engine_env import MULTIPROCESSING_ENV, PLUGINS_ENV, engine_env

    os.environ.update(engine_env(ROOT / "cache", 1))
    os.environ[MULTIPROCESSING_ENV] = "0"  # the engine core in this process: its error, not a wrapper's
    if args.kernel == "stock":  # no plugin loaded: vLLM's own kernel choice
        os.environ[PLUGINS_ENV] = "none"
    import torch
    from vllm import LLM, SamplingParams

    prompts = json.loads(Path(args.ids).read_text())
    try:
        llm = LLM(model=args.path, dtype="float32", enforce_eager=True, max_model_len=1024,
                  block_size=32, skip_tokenizer_init=True, seed=0)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=N_NEW, logprobs=TOP))
        rows = [{"tokens": list(o.outputs[0].token_ids),
                 "top": {str(k): v.logprob for k, v in o.outputs[0].logprobs[0].items()}}
                for o in outs]
        print(MARK + json.dumps({"rows": rows, "torch": torch.__version__}), flush=True)
    except Exception as e:  # what the engine says, in one line, is the finding
        print(MARK + json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}),
              flush=True)


def library(lm, prompts) -> dict:
    import torch

    from pop_analysis.engine.pop import greedy_from, run_prompt
    from pop_analysis.engine.precision import twins
    from pop_vllm.precision import Precision
    from pop_vllm.run_setting import RunSetting

    n = lm.adapter.n_layers
    runs = {"fp32": RunSetting((), "full"),
            "uniform int8": RunSetting((), "full", precision=Precision(tuple(range(n)), True)),
            "prefill int8": RunSetting((), "full", precision=Precision(tuple(range(n))))}
    out = {}
    for name, setting in runs.items():
        rows = []
        for p in prompts:
            first = run_prompt(lm.adapter, torch.tensor([p]), setting)
            lp = torch.log_softmax(first.logits.reshape(-1, first.logits.shape[-1])[-1], -1)
            top = lp.topk(TOP)
            dec = twins(lm.adapter, setting.precision) if setting.precision.decode_int8 else None
            toks = greedy_from(lm.adapter, first, max_new_tokens=N_NEW, twins=dec)[0].tolist()
            rows.append({"tokens": toks, "top": {str(int(i)): float(v)
                                                 for v, i in zip(top.values, top.indices)}})
        out[name] = {"rows": rows}
    return out


def compare(a: dict, b: dict) -> dict:
    """Same first token, same greedy tokens (up to the shorter run: vLLM stops at the end-of-text
    token, POP Lab's runs here do not), and the largest |log-prob difference| of the first token
    over the tokens both top-5 lists hold."""
    if "rows" not in a or "rows" not in b:
        return {}
    first = [x["tokens"][0] == y["tokens"][0] for x, y in zip(a["rows"], b["rows"])]
    same = [x["tokens"][:len(y["tokens"])] == y["tokens"][:len(x["tokens"])]
            for x, y in zip(a["rows"], b["rows"])]
    gaps = [abs(x["top"][t] - y["top"][t]) for x, y in zip(a["rows"], b["rows"])
            for t in set(x["top"]) & set(y["top"])]
    return {"first_token_same": sum(first) / len(first), "tokens_same": sum(same) / len(same),
            "max_abs_logprob_diff": max(gaps) if gaps else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", nargs="?", default="probe", choices=("probe", "serve"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--kernel", default="stock", choices=("stock", "plugin"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage == "serve":
        return serve(args)
    for name in ("path", "ids", "kernel"):  # the serve stage's own: not this run's parameters
        delattr(args, name)
    import torch

    from bench_results import RawFile
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.engine.generate import encode
    from pop_analysis.engine.models import load_model
    from pop_analysis.serving.int8_checkpoint import write
    from pop_analysis.speed.machine import cpu_model, int8_isa
    from pop_analysis.store.paths import cache_dir

    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    texts = load_prompts(str(DATA / "gsm8k_test.jsonl"), field="question", limit=args.prompts).prompts
    prompts = [encode(lm, t, raw=True) for t in texts]
    results = {"pop_lab": library(lm, prompts)}
    with tempfile.TemporaryDirectory(prefix="w8a8_") as tmp:
        int8 = write(cache_dir() / "models" / args.model, Path(tmp) / "model")
        ids = Path(tmp) / "ids.json"
        ids.write_text(json.dumps(prompts))
        for name, path, kernel in (("vllm fp32", cache_dir() / "models" / args.model, "stock"),
                                   ("vllm int8, vLLM's kernel choice", int8, "stock"),
                                   ("vllm int8, oneDNN kernel", int8, "plugin")):
            done = subprocess.run([str(VLLM_PY), __file__, "serve", "--path", str(path), "--ids",
                                   str(ids), "--kernel", kernel], capture_output=True, text=True,
                                  timeout=900, cwd=ROOT)
            got = [x[len(MARK):] for x in done.stdout.splitlines() if x.startswith(MARK)]
            results[name] = json.loads(got[-1]) if got else \
                {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:300]}"}
            print(name, json.dumps(results[name])[:300], flush=True)
    lib = results["pop_lab"]
    summary = {
        "vllm fp32 vs POP Lab fp32": compare(results["vllm fp32"], lib["fp32"]),
        "vllm int8 (oneDNN) vs POP Lab uniform int8": compare(results["vllm int8, oneDNN kernel"],
                                                              lib["uniform int8"]),
        "vllm int8 (oneDNN) vs POP Lab prefill int8": compare(results["vllm int8, oneDNN kernel"],
                                                              lib["prefill int8"]),
        "vllm int8 (oneDNN) vs POP Lab fp32": compare(results["vllm int8, oneDNN kernel"],
                                                      lib["fp32"]),
        "POP Lab uniform int8 vs POP Lab fp32": compare(lib["uniform int8"], lib["fp32"]),
        "POP Lab uniform vs prefill int8": compare(lib["uniform int8"], lib["prefill int8"]),
        "stock kernel choice": results["vllm int8, vLLM's kernel choice"].get("error", "ran")}
    RawFile("vllm_int8_probe", args, what=f"probe_{args.model}").write(
        {"model": args.model, "prompts": len(prompts), "cpu": cpu_model(), "int8_isa": int8_isa(),
         "summary": summary, "results": results})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
