"""The vLLM plugin in compiled mode (vLLM's compiler, not --enforce-eager) on a tiny random Llama
saved here: the engine's own block runs split.py's compiled pieces (layers below, the block on
the full tokens, layers above), and still equals POP Lab's `pop` token for token; the stock
compiled model equals POP Lab's `full`; another skip set takes the eager loop, also exact."""
import pytest
import torch

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import model_from_hf

from vllm_driver import Driver, check_venv, ok, tiny_llama

BLOCK = [2, 3]  # layers below it, the block, layers above it: all three pieces
OTHER = [3, 4, 5]  # a run-time switch to another block: not compiled for it, the eager loop
N_NEW = 6


@pytest.fixture(scope="module")
def compiled():
    check_venv()
    model, folder = tiny_llama("tiny-llama-compiled")
    prompts = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (37, 12, 25)]
    job = {"model": str(folder), "pop": {"skip": BLOCK},
           "engine": {"dtype": "float32", "enforce_eager": False, "max_model_len": 256,
                      "enable_prefix_caching": False, "skip_tokenizer_init": True,
                      "max_num_batched_tokens": 16, "max_num_seqs": 4, "seed": 0},
           "runs": [{"prompts": prompts, "max_tokens": N_NEW},
                    {"set": {"skip": [], "variant": "pop"}, "prompts": prompts, "max_tokens": N_NEW},
                    {"set": {"skip": OTHER, "variant": "pop"}, "prompts": prompts,
                     "max_tokens": N_NEW}]}
    driver = Driver("compiled", [job])
    try:
        lm = model_from_hf(model, name="tiny-llama")
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        ref = {key: [run(lm, p, v, tuple(s), cfg).token_ids for p in prompts]
               for key, v, s in [("block", "pop", BLOCK), ("full", "full", ()),
                                 ("other", "pop", OTHER)]}
    finally:
        result = driver.results()[0]
    return prompts, ok(result)["runs"], ref


def test_compiled_pieces_equal_pop_lab_pop(compiled):
    prompts, runs, ref = compiled
    assert ref["block"] != ref["full"]  # POP changes these tokens: the test can fail
    stats = runs[0]["stats"]
    assert runs[0]["tokens"] == ref["block"]
    assert stats["split"] == {"skip": BLOCK, "compiled": True}
    assert stats["split_steps"] == stats["pop_steps"] > 0
    assert stats["pruned_tokens"] == sum(len(p) - 1 for p in prompts)  # 16-token chunks included


def test_compiled_stock_model_equals_pop_lab_full(compiled):
    _, runs, ref = compiled
    assert runs[1]["tokens"] == ref["full"]
    assert runs[1]["stats"]["pop_steps"] == 0


def test_compiled_engine_another_block_takes_the_eager_loop(compiled):
    prompts, runs, ref = compiled
    stats = runs[2]["stats"]
    assert runs[2]["tokens"] == ref["other"]
    assert stats["skip"] == OTHER and stats["pop_steps"] > 0 and stats["split_steps"] == 0
