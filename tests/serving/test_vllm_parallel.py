"""Tensor and pipeline parallel engines with the POP plugin on this CPU: two ranks, one core each
(VLLM_CPU_OMP_THREADS_BIND "0|1"), token for token against POP Lab's own generation on the same
tiny random weights (greedy, eager, 16-token batch budget).

- Tensor parallel 2 on a tiny Llama with 2 K/V heads (one per rank): pop from hf_overrides, then
  switched at run time to pop_repair with maps made here (each rank keeps its head's rows), full.
  vLLM's CPU shared-memory communicator needs the AVX-512 build of its kernels; on an AVX2 CPU
  the ranks all-reduce through torch.distributed (gloo), which the log says.
- Pipeline parallel 2 on a tiny Gemma-3 (layers 0-2 and 3-5, the skipped block 3-5 in the second
  stage, 2-4 across both), compiled: pop, pop_no_boundary, full. Eager pipelines are refused in one
  line (vLLM 0.32's CPU backend fails them at the first step, stock models too).
"""
import pytest
import torch
from safetensors.torch import save_file

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import model_from_hf
from pop_vllm.run_setting import RunSetting

from tiny_saved import prompts as tiny_prompts
from tiny_saved import tiny
from vllm_driver import ROOT, Driver, check_venv, ok

SKIP = [3, 4, 5]
ACROSS = [2, 3, 4]  # a block across the two pipeline stages
N_NEW = 6
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256,
          "enable_prefix_caching": False, "skip_tokenizer_init": True,
          "max_num_batched_tokens": 16, "max_num_seqs": 4, "seed": 0}


def _maps(model) -> tuple[dict, str]:
    """pop_repair maps for SKIP: each layer's own K/V projections perturbed (a repair that changes
    the tokens), as layer -> (k weight, k bias, v weight, v bias) and as a maps file."""
    g = torch.Generator().manual_seed(11)
    maps = {}
    for i in SKIP:
        a = model.model.layers[i].self_attn
        maps[i] = tuple(t.contiguous() for t in (
            a.k_proj.weight + 0.5 * a.k_proj.weight.std() * torch.randn(a.k_proj.weight.shape, generator=g),
            0.05 * torch.randn(a.k_proj.weight.shape[0], generator=g),
            a.v_proj.weight + 0.5 * a.v_proj.weight.std() * torch.randn(a.v_proj.weight.shape, generator=g),
            0.05 * torch.randn(a.v_proj.weight.shape[0], generator=g)))
    path = ROOT / "cache" / "vllm_test" / "tiny-tp-maps.safetensors"
    save_file({f"{i}.{n}": t.detach() for i, parts in maps.items()
               for n, t in zip(("k.weight", "k.bias", "v.weight", "v.bias"), parts)}, str(path))
    return maps, str(path)


@pytest.fixture(scope="module")
def parallel():
    check_venv()
    prompts = tiny_prompts(37, 12, 25)
    llama, llama_dir = tiny("LlamaForCausalLM", 3, "tiny-llama-tp")
    gemma, gemma_dir = tiny("Gemma3ForCausalLM", 5, "tiny-gemma-pp")
    maps, maps_file = _maps(llama)
    runs = lambda *sets: [{"prompts": prompts, "max_tokens": N_NEW, **({"set": s} if s else {})}  # noqa: E731
                          for s in sets]
    jobs = [{"model": str(llama_dir), "pop": {"skip": SKIP},
             "engine": {**ENGINE, "tensor_parallel_size": 2},
             "runs": runs(None, {"skip": SKIP, "variant": "pop_repair", "repair": maps_file},
                          {"skip": SKIP, "variant": "full"})},
            {"model": str(gemma_dir), "architecture": "Gemma3ForCausalLM", "pop": {"skip": SKIP},
             "engine": {**ENGINE, "pipeline_parallel_size": 2}},  # eager: refused
            {"model": str(gemma_dir), "architecture": "Gemma3ForCausalLM", "pop": {"skip": SKIP},
             "engine": {**ENGINE, "pipeline_parallel_size": 2, "enforce_eager": False},
             "runs": runs(None, {"skip": ACROSS, "variant": "pop"},
                          {"skip": SKIP, "variant": "pop_no_boundary"}, {"skip": SKIP, "variant": "full"})}]
    driver = Driver("parallel", jobs)
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        gen = lambda lm, v, s: [run(lm, p, RunSetting(s, v), cfg).token_ids  # noqa: E731
                                for p in prompts]
        lm = model_from_hf(llama, name="tiny-llama")
        lm.adapter.register_kv_maps(SKIP, maps, "test maps")
        ref = {"tp": [gen(lm, "pop", SKIP), gen(lm, "pop_repair", SKIP), gen(lm, "full", ())]}
        lm = model_from_hf(gemma, name="tiny-gemma")
        ref["pp"] = [gen(lm, "pop", SKIP), gen(lm, "pop", ACROSS), gen(lm, "pop_no_boundary", SKIP),
                     gen(lm, "full", ())]
    finally:
        results = driver.results(timeout=600)
    return prompts, {"tp": ok(results[0])["runs"], "eager_pp": results[1],
                     "pp": ok(results[2])["runs"]}, ref, driver


def test_tensor_parallel_pop_and_repair_equal_pop_lab(parallel):
    prompts, runs, ref, driver = parallel
    tp = runs["tp"]
    assert len({str(r) for r in ref["tp"]}) == 3  # pop, pop_repair and full differ: it can fail
    for got, want in zip(tp, ref["tp"]):
        assert got["tokens"] == want
    assert tp[0]["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert tp[0]["stats"]["split_steps"] == tp[0]["stats"]["pop_steps"] > 0
    assert tp[1]["stats"]["variant"] == "pop_repair" and tp[2]["stats"]["pop_steps"] == 0
    log = driver.log_path.read_text()
    assert "tensor_parallel_size=2" in log and "core ids=[0]" in log and "core ids=[1]" in log


def test_pipeline_parallel_pop_equals_pop_lab(parallel):
    prompts, runs, ref, driver = parallel
    pp = runs["pp"]
    assert ref["pp"][0] != ref["pp"][3] and ref["pp"][1] != ref["pp"][3]
    for got, want in zip(pp, ref["pp"]):
        assert got["tokens"] == want
    assert pp[0]["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert pp[0]["stats"]["split_steps"] == 0  # a pipeline runs the layer loop
    assert pp[2]["stats"]["pruned_tokens"] == sum(len(p) for p in prompts)
    assert "pipeline_parallel_size=2" in driver.log_path.read_text()
    refused = runs["eager_pp"]
    assert not refused["ok"] and "compiled mode only" in refused["error"], refused
