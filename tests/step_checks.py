"""What every step-through must show, checked against the engine: shared by the unit tier (tiny
models) and the embedded tier (SmolLM2-135M, Gemma-3-270M)."""
from pop_analysis.inspection.stepthrough import frames
from pop_analysis.speed.flops import full_prefill_flops, pop_prefill_flops
from pop_analysis.store.records import check
from pop_vllm.run_setting import RunSetting


def assert_grid_equals_counts(rec) -> None:
    """Each step's grid against the engine's per-layer call counts of the same run: a layer ran
    attention and FFN once where the grid shows positions computed in full, and its K projection
    once more where the grid shows positions that only projected K/V."""
    for step in rec.steps:
        calls, where = step["calls"], f"{step['run']} {step['stage']}"
        for i in range(rec.n_layers):
            full, kv = bool(step["attention"][i]), bool(step["kv"][i])
            assert calls["attention"][i] == full, (where, i, calls["attention"][i], step["attention"][i])
            assert calls["ffn"][i] == bool(step["ffn"][i]), (where, i)
            assert step["ffn"][i] == step["attention"][i], (where, i)
            assert calls["k_proj"][i] == full + kv, (where, i, calls["k_proj"][i], full, kv)


def assert_pop_structure(rec, skip) -> None:
    """Which cells ran, as the method says (POP_METHOD.md §3, with x_N riding along below the
    first skipped layer), and every layer's cache complete and written once per position."""
    n, first, last = len(rec.prompt_ids), min(skip), n_positions(rec)
    by = {(s["run"], s["stage"]): s for s in rec.steps}
    prompt, trunk, bound = list(range(n - 1)), list(range(n)), [n - 1]
    for i in range(rec.n_layers):
        assert by[("full", "prefill")]["attention"][i] == trunk
        pre, b = by[("pop", "prefill")], by[("pop", "boundary")]
        if i < first:
            assert (pre["attention"][i], pre["kv"][i], b["attention"][i]) == (trunk, [], [])
        elif i in skip:
            assert (pre["attention"][i], pre["kv"][i], b["attention"][i]) == ([], prompt, bound)
        else:
            assert (pre["attention"][i], pre["kv"][i], b["attention"][i]) == (prompt, [], bound)
    for run in ("full", "pop"):
        for i in range(rec.n_layers):
            written = [p for s in rec.steps if s["run"] == run for p in s["attention"][i] + s["kv"][i]]
            assert sorted(written) == list(range(last)), (run, i, written)
            assert rec.cache_lengths[run][i] == last, (run, i)


def n_positions(rec) -> int:
    return len(rec.prompt_ids) + rec.config["decode_steps"]


def assert_flops_and_frames(rec, shape, skip) -> None:
    """Each step's FLOPs add up to the prefill counts the ideal speedup uses; the frames a class
    steps through: full prefill, POP prefill, boundary, then decode steps."""
    n = len(rec.prompt_ids)
    by = {(s["run"], s["stage"]): s for s in rec.steps}
    assert abs(by[("full", "prefill")]["flops"] / full_prefill_flops(shape, n) - 1) < 1e-9
    pop = by[("pop", "prefill")]["flops"] + by[("pop", "boundary")]["flops"]
    assert abs(pop / pop_prefill_flops(shape, n, RunSetting(skip)) - 1) < 1e-9
    titles = [f["title"] for f in frames(rec.steps)]
    assert titles[0].startswith("Full model: prefill") and titles[2].startswith("POP: boundary")
    assert len(titles) == 3 + rec.config["decode_steps"]
    assert by[("pop", "boundary")]["top"][0][0] == by[("pop", "boundary")]["token"][0]
    check("stepthrough", type(rec), rec.to_dict(), rec.n_layers)
