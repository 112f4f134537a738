"""The vLLM plugin inside a real engine (vLLM's CPU build, serving venv .venv-vllm) against POP
Lab's own generation on the embedded SmolLM2-135M, token for token (greedy).

One driver process (pop_vllm/pop_vllm/driver.py, run in .venv-vllm) tries the bad settings, starts
a stock engine, then one POP engine with a 16-token batch budget (chunked prefill, requests mixing
prefill and decode in one step) whose skip set and variant are switched at run time. POP Lab's
references are computed here meanwhile.
"""
from pathlib import Path

import pytest
from vllm_driver import Driver, check_venv, ok

from pop_analysis.engine.generate import SamplingConfig, encode, run

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "cache" / "models" / "smollm2-135m"
N_NEW = 8
TAIL = list(range(20, 30))  # the last third of 30 layers
SPLIT = [8, 12, 20, 21, 22, 23, 24]  # a non-contiguous skip set
TEXTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers.",
    "A train leaves at 9:40 and arrives at 13:15. How long is the journey in minutes? "
    "Explain each step of the calculation carefully, then give the answer in hours and minutes. "
    * 3,
]
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "seed": 0,
          "enable_prefix_caching": False}


def _jobs(prompts) -> dict:
    bad = lambda pop, **eng: {"model": str(MODEL), "engine": {**ENGINE, **eng}, "pop": pop}  # noqa: E731
    runs = [
        {"prompts": prompts, "max_tokens": N_NEW},  # pop 20-29 from hf_overrides, batched
        {"prompts": prompts[:2], "max_tokens": N_NEW, "batched": False},
        {"set": {"skip": SPLIT, "variant": "pop"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": TAIL, "variant": "pop_no_boundary"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": [], "variant": "pop"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": TAIL, "variant": "full"}, "prompts": prompts, "max_tokens": N_NEW},
    ]
    return [
        bad({"skip": [30], "variant": "pop"}),
        bad({"skip": [3], "variant": "popx"}),
        bad({"skip": TAIL, "variant": "pop"}, enable_prefix_caching=True),
        {"model": str(MODEL), "engine": ENGINE, "pop": None,
         "runs": [{"prompts": prompts, "max_tokens": N_NEW}]},
        {"model": str(MODEL), "engine": {**ENGINE, "max_num_batched_tokens": 16, "max_num_seqs": 8},
         "pop": {"skip": TAIL, "variant": "pop"}, "runs": runs},
    ]


@pytest.fixture(scope="module")
def engine(embedded):
    """(prompts, driver results, POP Lab tokens by (variant, skip))."""
    check_venv()
    if not MODEL.is_dir():
        pytest.fail(f"converted model missing at {MODEL}: run bash scripts/install.sh")
    prompts = [encode(embedded, t) for t in TEXTS]
    driver = Driver("engine", _jobs(prompts))
    try:
        cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
        ref = {(v, tuple(s)): [run(embedded, p, v, tuple(s), cfg).token_ids for p in prompts]
               for v, s in [("full", ()), ("pop", TAIL), ("pop", SPLIT), ("pop_no_boundary", TAIL)]}
    finally:
        jobs = driver.results()
    return prompts, jobs, ref


def test_bad_settings_give_one_line_before_any_engine_starts(engine):
    jobs = engine[1]
    for job, message in zip(jobs[:3], ["skip layer(s) 30 out of range",
                                       "unknown POP variant 'popx'",
                                       "prefix caching breaks exact POP"]):
        assert not job["ok"]
        assert message in job["error"] and "\n" not in job["error"]


def test_stock_vllm_equals_pop_lab_full(engine):
    _, jobs, ref = engine
    assert ok(jobs[3])["runs"][0]["tokens"] == ref[("full", ())]


def test_pop_equals_pop_lab_pop_batched_chunked(engine):
    prompts, jobs, ref = engine
    runs = ok(jobs[4])["runs"]
    assert runs[0]["tokens"] == ref[("pop", tuple(TAIL))]
    assert runs[1]["tokens"] == ref[("pop", tuple(TAIL))][:2]  # one request at a time
    stats = runs[0]["stats"]
    # Exactly x_1..x_{N-1} of every prompt took the pruned path, however the 16-token budget cut
    # them into chunks; decode-only steps never did.
    assert stats["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert stats["decode_only_steps"] > 0 and stats["decode_only_pop_steps"] == 0
    assert stats["pop_steps"] >= max(len(p) for p in prompts) // 16
    # the engine's own contiguous block runs split.py's pieces (uncompiled here, as eager)
    assert stats["split_steps"] == stats["pop_steps"] and runs[1]["stats"]["split_steps"] > 0


def test_pop_non_contiguous_skip_set(engine):
    prompts, jobs, ref = engine
    run_ = ok(jobs[4])["runs"][2]
    assert run_["stats"]["skip"] == SPLIT
    assert run_["tokens"] == ref[("pop", tuple(SPLIT))]
    assert run_["stats"]["split_steps"] == 0  # not the engine's block: the eager layer loop
    assert run_["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)


def test_pop_no_boundary(engine):
    prompts, jobs, ref = engine
    run_ = ok(jobs[4])["runs"][3]
    assert run_["tokens"] == ref[("pop_no_boundary", tuple(TAIL))]
    assert run_["stats"]["pruned_tokens"] == sum(len(p) for p in prompts)
    assert run_["stats"]["split_steps"] == run_["stats"]["pop_steps"] > 0


def test_empty_skip_set_and_full_variant_are_the_stock_model(engine):
    _, jobs, ref = engine
    stock = ok(jobs[3])["runs"][0]["tokens"]
    for run_ in ok(jobs[4])["runs"][4:6]:
        assert run_["tokens"] == stock == ref[("full", ())]
        assert run_["stats"]["pop_steps"] == 0 and run_["stats"]["pruned_tokens"] == 0
    # and POP really changes something on these prompts (else the comparisons above prove little)
    assert ref[("pop", tuple(TAIL))] != ref[("full", ())]
