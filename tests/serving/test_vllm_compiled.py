"""The vLLM plugin in compiled mode (vLLM's compiler, not --enforce-eager) on a tiny random Llama
and a tiny random Gemma-3 (16-token sliding windows) saved here: the engine's own block runs
split.py's compiled pieces (layers below, the block on the full tokens, layers above), and still
equals POP Lab's `pop` token for token; the stock compiled model equals POP Lab's `full`; another
skip set takes the eager loop, also exact. One driver process starts both engines in turn."""
import pytest

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import model_from_hf
from pop_vllm.run_setting import RunSetting

from tiny_saved import prompts as tiny_prompts
from tiny_saved import tiny
from vllm_driver import Driver, check_venv, ok

ARCHS = ("LlamaForCausalLM", "Gemma3ForCausalLM")
BLOCK = [2, 3]  # layers below it, the block, layers above it: all three pieces
OTHER = [3, 4, 5]  # a run-time switch to another block: not compiled for it, the eager loop
N_NEW = 6


@pytest.fixture(scope="module")
def compiled():
    check_venv()
    prompts = tiny_prompts(37, 12, 25)
    models, jobs = {}, []
    for arch in ARCHS:
        models[arch], folder = tiny(arch, 7, f"tiny-{arch}-compiled")
        jobs.append({"model": str(folder), "architecture": arch, "pop": {"skip": BLOCK},
                     "engine": {"dtype": "float32", "enforce_eager": False, "max_model_len": 256,
                                "enable_prefix_caching": False, "skip_tokenizer_init": True,
                                "max_num_batched_tokens": 16, "max_num_seqs": 4, "seed": 0},
                     "runs": [{"prompts": prompts, "max_tokens": N_NEW},
                              {"set": {"skip": [], "variant": "pop"}, "prompts": prompts,
                               "max_tokens": N_NEW},
                              {"set": {"skip": OTHER, "variant": "pop"}, "prompts": prompts,
                               "max_tokens": N_NEW}]})
    driver = Driver("compiled", jobs)
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        ref = {}
        for arch, model in models.items():
            lm = model_from_hf(model, name=arch)
            ref[arch] = {key: [run(lm, p, RunSetting(tuple(s), v), cfg).token_ids for p in prompts]
                         for key, v, s in [("block", "pop", BLOCK), ("full", "full", ()),
                                           ("other", "pop", OTHER)]}
    finally:
        results = driver.results(timeout=600)
    return prompts, {a: ok(r)["runs"] for a, r in zip(ARCHS, results)}, ref


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_pieces_equal_pop_lab_pop(compiled, arch):
    prompts, runs, ref = compiled
    runs, ref = runs[arch], ref[arch]
    assert ref["block"] != ref["full"]  # POP changes these tokens: the test can fail
    stats = runs[0]["stats"]
    assert runs[0]["tokens"] == ref["block"]
    assert stats["split"] == {"skip": BLOCK, "compiled": True}
    assert stats["split_steps"] == stats["pop_steps"] > 0
    assert stats["pruned_tokens"] == sum(len(p) - 1 for p in prompts)  # 16-token chunks included


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_stock_model_equals_pop_lab_full(compiled, arch):
    _, runs, ref = compiled
    assert runs[arch][1]["tokens"] == ref[arch]["full"]
    assert runs[arch][1]["stats"]["pop_steps"] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_engine_another_block_takes_the_eager_loop(compiled, arch):
    _, runs, ref = compiled
    stats = runs[arch][2]["stats"]
    assert runs[arch][2]["tokens"] == ref[arch]["other"]
    assert stats["skip"] == OTHER and stats["pop_steps"] > 0 and stats["split_steps"] == 0
