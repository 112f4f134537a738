"""The vLLM plugin inside a real engine (vLLM's CPU build, serving venv .venv-vllm) against POP
Lab's own generation on the embedded SmolLM2-135M, token for token (greedy).

A K/V repair of layers 20-29 is fitted first (POP Lab's repair API, 48 builtin prompts, stored in
a temporary store). Then one driver process (pop_vllm/pop_vllm/driver.py, run in .venv-vllm) tries
the bad settings, starts a stock engine, one POP engine with a 16-token batch budget (chunked
prefill, requests mixing prefill and decode in one step) whose skip set, variant and repair maps
are switched at run time, and one pop_repair engine with a KV cache too small for its requests
(vLLM preempts and recomputes them). POP Lab's references are computed here meanwhile.
Prompt log-probs (issue 32): requests asking for them run the full path on the POP engine, mixed in
one batch with requests that do not; both engines return their log-probs.
"""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pop_analysis.engine.generate import SamplingConfig, encode, run
from pop_analysis.repair import store as repair_store
from pop_analysis.repair.fit import RepairConfig, fit_repair
from pop_analysis.repair.store import maps_file
from pop_vllm.run_setting import RunSetting

from vllm_driver import Driver, check_venv, ok

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "cache" / "models" / "smollm2-135m"
N_NEW = 8
TAIL = list(range(20, 30))  # the last third of 30 layers
SPLIT = [8, 12, 20, 21, 22, 23, 24]  # a non-contiguous skip set
UPPER = list(range(25, 30))  # a repair of another block than the engine's: the eager layer loop
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
N_PREEMPT = 32  # tokens generated per request in the preemption run
# 5 requests need 19 blocks of 32 tokens (CPU attention's block sizes are multiples of 32) at their
# longest, the four short ones 3 each; the cache holds 9 (the fewest for a 256-token request): the
# short ones run together and, growing past 64 tokens, preempt each other and are recomputed from
# their prompt and generated tokens.
ASKED = [1, None, 1, None, 1]  # prompt log-probs per request of the mixed batch
LP_TOL = 1e-3
PREEMPT_ENGINE = {**ENGINE, "max_model_len": 256, "block_size": 32, "num_gpu_blocks_override": 9,
                  "max_num_seqs": 8, "max_num_batched_tokens": 32, "disable_log_stats": False}


def _maps(folder: Path, rep) -> dict:
    """Maps files for the bad-input and corrupted-maps runs, beside the stored good one."""
    t = rep.tensors
    files = {"zeros": {n: torch.zeros_like(x) for n, x in t.items()},
             "other_skip": {n: x for n, x in t.items() if not n.startswith("29.")},
             "shapes": {n: (x[:, :-1] if x.dim() == 2 else x).contiguous() for n, x in t.items()}}
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, tensors in files.items():
        out[name] = str(folder / f"{name}.safetensors")
        save_file(tensors, out[name])
    out["missing"] = str(folder / "missing.safetensors")
    return out


def _jobs(prompts, maps) -> dict:
    lp = {"prompts": prompts, "max_tokens": N_NEW, "logprobs": 1}
    bad = lambda pop, **eng: {"model": str(MODEL), "engine": {**ENGINE, **eng}, "pop": pop}  # noqa: E731
    repair = lambda name, skip=TAIL: {"skip": skip, "variant": "pop_repair", "repair": maps[name]}  # noqa: E731
    runs = [
        {"prompts": prompts, "max_tokens": N_NEW},  # pop 20-29 from hf_overrides, batched
        {"prompts": prompts[:2], "max_tokens": N_NEW, "batched": False},
        {"set": {"skip": SPLIT, "variant": "pop"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": TAIL, "variant": "pop_no_boundary"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": [], "variant": "pop"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": {"skip": TAIL, "variant": "full"}, "prompts": prompts, "max_tokens": N_NEW},
        {"set": repair("good"), "prompts": prompts, "max_tokens": N_NEW},  # 6
        {"set": repair("zeros"), "prompts": prompts, "max_tokens": N_NEW},
        {"set": repair("other_skip"), "prompts": prompts[:1], "max_tokens": 1},  # 8: refused
        {"set": {"skip": TAIL, "variant": "pop_no_kv"}, "prompts": prompts[:1], "max_tokens": 1},
        {"prompts": prompts[:1], "max_tokens": N_NEW},  # 10: still the zeros maps
        {"set": repair("upper", UPPER), "prompts": prompts, "max_tokens": N_NEW},
        # 12-14: prompt log-probs asked by some requests of a batch, all, the others
        {"set": {"skip": TAIL, "variant": "pop"}, **lp, "prompt_logprobs": ASKED},
        {"set": {"skip": TAIL, "variant": "pop_no_boundary"}, **lp, "prompt_logprobs": 1},
        {"set": repair("good"), **lp, "prompt_logprobs": [None if k else 1 for k in ASKED]},
        # 15: a switch while requests are in flight, refused by an in-process engine
        {"set": {"skip": TAIL, "variant": "pop"}, "prompts": prompts[:2], "max_tokens": N_NEW,
         "switch_in_flight": {"set": {"skip": TAIL, "variant": "full"}}},
        {"prompts": prompts[:1], "max_tokens": N_NEW},  # 16: still pop, still serving
    ]
    preempt = [{"prompts": prompts, "max_tokens": N_PREEMPT},
               {"set": {"skip": TAIL, "variant": "pop"}, "prompts": prompts, "max_tokens": N_PREEMPT}]
    return [
        bad({"skip": [30], "variant": "pop"}),
        bad({"skip": [3], "variant": "popx"}),
        bad({"skip": TAIL, "variant": "pop_repair"}),  # 2: no maps file
        bad(repair("missing")),
        bad(repair("other_skip")),
        bad(repair("shapes")),
        bad(repair("good", TAIL[:-1])),  # 6: maps for 20-29, skip set 20-28
        bad({"skip": TAIL, "variant": "pop_no_kv"}),
        bad({"skip": TAIL, "variant": "pop"}, runner="pooling"),  # 8: an embedding engine
        {"model": str(MODEL), "engine": ENGINE, "pop": None,
         "runs": [{"prompts": prompts, "max_tokens": N_NEW},
                  {**lp, "prompt_logprobs": 1}]},
        {"model": str(MODEL), "engine": {**ENGINE, "max_num_batched_tokens": 16, "max_num_seqs": 8},
         "pop": {"skip": TAIL, "variant": "pop"}, "runs": runs},
        {"model": str(MODEL), "engine": PREEMPT_ENGINE, "pop": repair("good"), "runs": preempt},
    ]


BAD = ["layer(s) 30 out of range", "unknown variant 'popx'",
       "pop_repair needs a repair maps file", "does not exist",
       "not exactly skip set [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]", "does not fit this model",
       "not exactly skip set [20, 21, 22, 23, 24, 25, 26, 27, 28]",
       "pop_no_kv is not supported in vLLM",
       "the POP plugin serves generation only: runner 'pooling' is not supported"]
STOCK, POP, PREEMPT = len(BAD), len(BAD) + 1, len(BAD) + 2  # the engines' jobs


@pytest.fixture(scope="module")
def engine(embedded, tmp_path_factory):
    """(prompts, driver results, POP Lab tokens by (variant, skip[, new tokens]))."""
    check_venv()
    if not MODEL.is_dir():
        pytest.fail(f"converted model missing at {MODEL}: run bash scripts/install.sh")
    prompts = [encode(embedded, t) for t in TEXTS]
    with pytest.MonkeyPatch.context() as mp:  # the repair goes to a temporary store
        mp.setenv("POP_LAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        reps = {tuple(s): repair_store.save(fit_repair(embedded, s, RepairConfig(n_samples=48)))
                for s in (TAIL, UPPER)}
        maps = {"good": maps_file(reps[tuple(TAIL)].key),  # as serve finds it
                "upper": maps_file(reps[tuple(UPPER)].key),
                **_maps(tmp_path_factory.mktemp("maps"), reps[tuple(TAIL)])}
        driver = Driver("engine", _jobs(prompts, maps))
        try:
            ref = _references(embedded, prompts, reps)
        finally:
            jobs = driver.results()
    return prompts, jobs, ref, maps


def _references(lm, prompts, reps) -> dict:
    cfg = SamplingConfig(max_new_tokens=N_NEW, stop_at_eos=False)
    ref = {(v, tuple(s)): [run(lm, p, RunSetting(tuple(s), v), cfg).token_ids for p in prompts]
           for v, s in [("full", ()), ("pop", TAIL), ("pop", SPLIT), ("pop_no_boundary", TAIL)]}
    long = SamplingConfig(max_new_tokens=N_PREEMPT, stop_at_eos=False)
    ref[("pop", tuple(TAIL), N_PREEMPT)] = [run(lm, p, RunSetting(TAIL), long).token_ids
                                            for p in prompts]
    for skip, rep_ in reps.items():
        repair_store.attach(lm, rep_, skip)
    try:
        for skip in reps:
            ref[("pop_repair", skip)] = [run(lm, p, RunSetting(skip, "pop_repair"), cfg).token_ids
                                         for p in prompts]
        repaired = RunSetting(TAIL, "pop_repair")
        ref[("pop_repair", tuple(TAIL), N_PREEMPT)] = [run(lm, p, repaired, long).token_ids
                                                       for p in prompts]
    finally:
        for skip in reps:
            lm.adapter.kv_maps.pop(skip, None)
    return ref


def test_bad_settings_give_one_line_before_any_engine_starts(engine):
    jobs = engine[1]
    assert len(jobs) == PREEMPT + 1
    for job, message in zip(jobs[:STOCK], BAD):
        assert not job["ok"]
        assert message in job["error"] and "\n" not in job["error"], (message, job["error"])


def test_stock_vllm_equals_pop_lab_full(engine):
    _, jobs, ref = engine[:3]
    assert ok(jobs[STOCK])["runs"][0]["tokens"] == ref[("full", ())]


def test_pop_equals_pop_lab_pop_batched_chunked(engine):
    prompts, jobs, ref = engine[:3]
    runs = ok(jobs[POP])["runs"]
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
    prompts, jobs, ref = engine[:3]
    run_ = ok(jobs[POP])["runs"][2]
    assert run_["stats"]["skip"] == SPLIT
    assert run_["tokens"] == ref[("pop", tuple(SPLIT))]
    assert run_["stats"]["split_steps"] == 0  # not the engine's block: the eager layer loop
    assert run_["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)


def test_pop_no_boundary(engine):
    prompts, jobs, ref = engine[:3]
    run_ = ok(jobs[POP])["runs"][3]
    assert run_["tokens"] == ref[("pop_no_boundary", tuple(TAIL))]
    assert run_["stats"]["pruned_tokens"] == sum(len(p) for p in prompts)
    assert run_["stats"]["split_steps"] == run_["stats"]["pop_steps"] > 0


def test_empty_skip_set_and_full_variant_are_the_stock_model(engine):
    _, jobs, ref = engine[:3]
    stock = ok(jobs[STOCK])["runs"][0]["tokens"]
    for run_ in ok(jobs[POP])["runs"][4:6]:
        assert run_["tokens"] == stock == ref[("full", ())]
        assert run_["stats"]["pop_steps"] == 0 and run_["stats"]["pruned_tokens"] == 0
    # and POP really changes something on these prompts (else the comparisons above prove little)
    assert ref[("pop", tuple(TAIL))] != ref[("full", ())]


def test_pop_repair_equals_pop_lab_pop_repair(engine):
    """The stored maps, switched in at run time, as the pruned tokens' K/V projection."""
    prompts, jobs, ref, maps = engine
    runs = ok(jobs[POP])["runs"]
    good, zeros = runs[6], runs[7]
    assert good["stats"]["variant"] == "pop_repair" and good["stats"]["repair"] == maps["good"]
    assert good["tokens"] == ref[("pop_repair", tuple(TAIL))]
    assert good["stats"]["pruned_tokens"] == sum(len(p) - 1 for p in prompts)
    assert good["stats"]["split_steps"] == good["stats"]["pop_steps"]  # split.py's pieces
    upper = runs[11]  # another block than the engine's: the eager layer loop takes the maps
    assert upper["stats"]["split_steps"] == 0 and upper["stats"]["pop_steps"] > 0
    assert upper["tokens"] == ref[("pop_repair", tuple(UPPER))]
    # The maps matter: the repair changes tokens against plain POP, and zeroed maps change them
    # again (a plugin ignoring the maps would give plain POP's tokens in both runs).
    assert ref[("pop_repair", tuple(TAIL))] != ref[("pop", tuple(TAIL))]
    assert zeros["tokens"] != good["tokens"] and zeros["tokens"] != ref[("pop", tuple(TAIL))]


def test_bad_run_time_switch_gives_one_line_and_keeps_the_settings(engine):
    _, jobs, ref, maps = engine
    runs = ok(jobs[POP])["runs"]
    for run_, message in ((runs[8], "not exactly skip set"), (runs[9], "pop_no_kv is not supported")):
        assert message in run_["error"] and "\n" not in run_["error"], run_
    assert runs[10]["stats"]["repair"] == maps["zeros"] and runs[10]["tokens"] == runs[7]["tokens"][:1]


def test_an_in_process_engine_refuses_a_switch_with_requests_in_flight(engine):
    """Its caller steps it, so it cannot let them finish first (a server's engine core drains
    them: tests/serving/test_prefix_cache.py): one line, the settings and the engine unchanged."""
    prompts, jobs, ref, _ = engine
    runs = ok(jobs[POP])["runs"]
    assert "in flight: an in-process engine" in runs[15]["error"], runs[15]
    assert "\n" not in runs[15]["error"] and runs[15]["at_switch"]["pruned_tokens"] > 0
    assert runs[16]["stats"]["variant"] == "pop" and runs[16]["tokens"] == ref[("pop", tuple(TAIL))][:1]


def test_preemption_recompute_stays_exact(engine):
    """Requests preempted for KV blocks are recomputed (prompt and generated tokens in one
    prefill): the generated tokens stay full, so the tokens equal POP Lab's, for pop_repair
    (from hf_overrides at start-up) and pop (switched at run time)."""
    prompts, jobs, ref, _ = engine
    job = ok(jobs[PREEMPT])
    before = 0
    for run_, variant in zip(job["runs"], ("pop_repair", "pop")):
        assert run_["stats"]["variant"] == variant
        assert run_["preemptions"] > before, run_["preemptions"]  # vLLM's own counter
        before = run_["preemptions"]
        assert run_["stats"]["recomputed_tokens"] > 0  # generated tokens scheduled again
        assert run_["tokens"] == ref[(variant, tuple(TAIL), N_PREEMPT)]


def _close(a, b) -> float:
    """Largest difference of two log-prob lists (None where vLLM gives none: prompt position 0)."""
    assert [x is None for x in a] == [y is None for y in b]
    return max(abs(x - y) for x, y in zip(a, b) if x is not None)


def test_prompt_logprobs_run_the_full_path_and_equal_a_stock_engine(engine):
    """A POP engine never returns prompt log-probs that are not the model's: a request asking for
    them runs every token on the full path (its tokens, prompt and generated log-probs equal the
    stock engine's), while the requests of the same batch that do not ask stay POP."""
    prompts, jobs, ref, _ = engine
    stock = ok(jobs[STOCK])["runs"][1]
    runs = ok(jobs[POP])["runs"]
    assert stock["tokens"] == ref[("full", ())]
    for run_, asked, variant in ((runs[12], ASKED, "pop"), (runs[13], [1] * 5, "pop_no_boundary"),
                                 (runs[14], [None if k else 1 for k in ASKED], "pop_repair")):
        assert run_["stats"]["variant"] == variant
        plain = [p for p, k in zip(prompts, asked) if k is None]
        for r, k in enumerate(asked):
            if k is None:  # served as POP: its own tokens, no prompt log-probs returned
                assert run_["tokens"][r] == ref[(variant, tuple(TAIL))][r]
                assert run_["prompt_logprobs"][r] is None
                continue
            assert run_["tokens"][r] == stock["tokens"][r]
            assert _close(run_["prompt_logprobs"][r], stock["prompt_logprobs"][r]) < LP_TOL
            assert _close(run_["logprobs"][r], stock["logprobs"][r]) < LP_TOL
        stats = run_["stats"]
        asked_prompts = [p for p, k in zip(prompts, asked) if k is not None]
        boundary = 0 if variant == "pop_no_boundary" else 1
        assert stats["logprob_full_tokens"] == sum(len(p) - boundary for p in asked_prompts)
        assert stats["pruned_tokens"] == sum(len(p) - boundary for p in plain)
