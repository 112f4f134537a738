"""Gemma-3 inside a real engine: the embedded Gemma-3-270M (18 layers, sliding-window layers with a
512-token window, q/k norms, four norms per block, one K/V head) served by vLLM with the POP
plugin, token for token against POP Lab's own generation (greedy, eager).

One POP engine (skip 12-17, the last third) with a 16-token batch budget (chunked prefill, requests
mixing prefill and decode in one step) runs pop from its hf_overrides, batched and one request at a
time, then is switched at run time to a non-contiguous skip set, pop_no_boundary, an empty skip
set, full, and pop_repair with a repair of 12-17 fitted here. One prompt is longer than the sliding
window, so the windowed layers' K/V of pruned tokens is read by x_N through the window.
The compiled path runs on a tiny random Gemma-3 in test_vllm_compiled.py.
"""
from pathlib import Path

import pytest

from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import RepairConfig, fit_repair
from pop_analysis.repair.store import maps_file
from pop_vllm.run_setting import RunSetting

from vllm_driver import Driver, check_venv, ok

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "cache" / "models" / "gemma3-270m"
N_NEW = 8
TAIL = list(range(12, 18))  # the last third of 18 layers
SPLIT = [3, 9, 14, 15, 16]  # a non-contiguous skip set (sliding and global layers)
TEXTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "List three prime numbers.",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes? "
    "Explain each step of the calculation carefully, then give the answer in hours and minutes. "
    * 12,  # beyond the 512-token window
]
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0,
          "enable_prefix_caching": False, "max_num_batched_tokens": 16, "max_num_seqs": 8}


def _runs(prompts, maps: str) -> list[dict]:
    run_ = lambda **kw: {"prompts": prompts, "max_tokens": N_NEW, **kw}  # noqa: E731
    return [
        run_(),  # pop 12-17 from hf_overrides, batched
        {**run_(), "prompts": prompts[:2], "batched": False},
        run_(set={"skip": SPLIT, "variant": "pop"}),
        run_(set={"skip": TAIL, "variant": "pop_no_boundary"}),
        run_(set={"skip": [], "variant": "pop"}),
        run_(set={"skip": TAIL, "variant": "full"}),
        run_(set={"skip": TAIL, "variant": "pop_repair", "repair": maps}),  # 6
    ]


@pytest.fixture(scope="module")
def gemma_engine(gemma, tmp_path_factory):
    """(prompts, the POP engine's runs, POP Lab tokens by (variant, skip))."""
    check_venv()
    if not MODEL.is_dir():
        pytest.fail(f"converted model missing at {MODEL}: run bash scripts/install.sh")
    prompts = [encode(gemma, t) for t in TEXTS]
    assert len(prompts[-1]) > 512, len(prompts[-1])  # the window must matter
    with pytest.MonkeyPatch.context() as mp:  # the repair goes to a temporary store
        mp.setenv("POP_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        rep = repair_store.save(fit_repair(gemma, TAIL, RepairConfig(n_samples=64)))  # 640 features
        maps = maps_file(rep.key)
        job = {"model": str(MODEL), "architecture": "Gemma3ForCausalLM", "engine": ENGINE,
               "pop": {"skip": TAIL, "variant": "pop"}, "runs": _runs(prompts, maps)}
        driver = Driver("gemma", [job])
        try:
            ref = _references(gemma, prompts, rep)
        finally:
            result = driver.results()[0]
    return prompts, ok(result)["runs"], ref


def _references(lm, prompts, rep) -> dict:
    cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
    ref = {(v, tuple(s)): [run(lm, p, RunSetting(tuple(s), v), cfg).token_ids for p in prompts]
           for v, s in [("full", ()), ("pop", TAIL), ("pop", SPLIT), ("pop_no_boundary", TAIL)]}
    repair_store.attach(lm, rep, TAIL)
    try:
        repaired = RunSetting(TAIL, "pop_repair")
        ref[("pop_repair", tuple(TAIL))] = [run(lm, p, repaired, cfg).token_ids for p in prompts]
    finally:
        lm.adapter.kv_maps.pop(tuple(TAIL), None)
    return ref


def test_gemma_pop_equals_pop_lab_batched_chunked(gemma_engine):
    prompts, runs, ref = gemma_engine
    assert ref[("pop", tuple(TAIL))] != ref[("full", ())]  # POP changes these tokens: it can fail
    assert runs[0]["tokens"] == ref[("pop", tuple(TAIL))]
    assert runs[1]["tokens"] == ref[("pop", tuple(TAIL))][:2]  # one request at a time
    stats = runs[0]["stats"]
    assert stats["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert stats["decode_only_steps"] > 0 and stats["decode_only_pop_steps"] == 0
    assert stats["split_steps"] == stats["pop_steps"] > 0  # the engine's block: split.py's pieces


def test_gemma_non_contiguous_skip_set_and_no_boundary(gemma_engine):
    prompts, runs, ref = gemma_engine
    assert runs[2]["tokens"] == ref[("pop", tuple(SPLIT))]
    assert runs[2]["stats"]["split_steps"] == 0 < runs[2]["stats"]["pop_steps"]  # the layer loop
    assert runs[3]["tokens"] == ref[("pop_no_boundary", tuple(TAIL))]
    assert runs[3]["stats"]["pruned_tokens"] == sum(len(p) for p in prompts)


def test_gemma_empty_skip_set_and_full_are_the_stock_model(gemma_engine):
    _, runs, ref = gemma_engine
    for run_ in runs[4:6]:
        assert run_["tokens"] == ref[("full", ())]
        assert run_["stats"]["pop_steps"] == 0


def test_gemma_pop_repair_equals_pop_lab(gemma_engine):
    prompts, runs, ref = gemma_engine
    good = runs[6]
    assert good["stats"]["variant"] == "pop_repair"
    assert ref[("pop_repair", tuple(TAIL))] != ref[("pop", tuple(TAIL))]  # the maps matter
    assert good["tokens"] == ref[("pop_repair", tuple(TAIL))]
    assert good["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
