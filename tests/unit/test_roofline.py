"""The op model behind both ideals, the roofline arithmetic, and the cached machine rates."""
import dataclasses
import math

import pytest

from pop_analysis.engine.adapter import Shape
from pop_analysis.speed.flops import ideal_speedup, prefill_flop_share
from pop_analysis.speed.machine import Rates, machine_rates
from pop_analysis.speed.roofline import (
    attention_span,
    breakdown,
    prefill_ops,
    roofline_speedup,
    total_flops,
)
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import Variant

SMOL = Shape(n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, intermediate=1536,
             vocab=49152, max_positions=8192)
LAST_THIRD = tuple(range(20, 30))


def rates(flops=2e11, bandwidth=2e10) -> Rates:
    return Rates((1, 4096), (flops, flops), bandwidth, "test")


def test_flop_ideal_matches_the_closed_form_for_the_papers_block():
    # closed form: 20 layers over N, 10 K/V projections over N-1, 10 layers for x_N alone
    s, n = SMOL, 512
    dq, dkv = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim

    def layer(t, ctx):
        return 2 * t * s.hidden * (2 * dq + 2 * dkv) + 6 * t * s.hidden * s.intermediate + 4 * dq * ctx

    head = 2 * s.hidden * s.vocab
    full = 30 * layer(n, n * (n + 1) // 2) + head
    pop = 20 * layer(n, n * (n + 1) // 2) + 10 * 4 * (n - 1) * s.hidden * dkv + 10 * layer(1, n) + head
    assert ideal_speedup(s, n, RunSetting(LAST_THIRD)) == pytest.approx(full / pop, rel=1e-12)
    assert [round(ideal_speedup(s, n, RunSetting(LAST_THIRD)), 2)
            for n in (32, 128, 512, 2048)] == [1.43, 1.45, 1.46, 1.47]
    assert prefill_flop_share(s, 512, RunSetting(LAST_THIRD)) == pytest.approx(pop / full)


@pytest.mark.parametrize("path", [v for v in Variant if v != Variant.POP_REPAIR])
def test_nothing_skipped_is_the_full_model(path):
    assert ideal_speedup(SMOL, 64, RunSetting((), path)) == pytest.approx(1.0)
    assert roofline_speedup(SMOL, 64, RunSetting((), path), rates()) == pytest.approx(1.0)


def test_roofline_equals_flop_ideal_when_nothing_is_memory_bound():
    r = rates(bandwidth=math.inf)
    for n in (32, 512):
        assert roofline_speedup(SMOL, n, RunSetting(LAST_THIRD), r) == \
            pytest.approx(ideal_speedup(SMOL, n, RunSetting(LAST_THIRD)), rel=1e-9)


def test_shared_memory_bound_work_caps_short_prompts():
    r = rates()
    short = roofline_speedup(SMOL, 32, RunSetting(LAST_THIRD), r)
    long = roofline_speedup(SMOL, 2048, RunSetting(LAST_THIRD), r)
    assert 1.0 < short < ideal_speedup(SMOL, 32, RunSetting(LAST_THIRD)) - 0.1, short
    assert long == pytest.approx(ideal_speedup(SMOL, 2048, RunSetting(LAST_THIRD)), rel=0.03)
    parts = breakdown(SMOL, 32, RunSetting(LAST_THIRD), r)
    assert parts["lm_head (memory)"] == pytest.approx(2 * 576 * 49152 / 2e10 * 2, rel=0.01)


def test_ablation_paths_do_less_or_more_work_as_they_should():
    n = 256
    pop = total_flops(prefill_ops(SMOL, n, RunSetting(LAST_THIRD)))
    assert total_flops(prefill_ops(SMOL, n, RunSetting(LAST_THIRD, "pop_no_kv"))) < pop
    assert total_flops(prefill_ops(SMOL, n, RunSetting(LAST_THIRD, "static"))) < \
        total_flops(prefill_ops(SMOL, n, RunSetting(LAST_THIRD, "pop_no_boundary"))) < pop
    pop_ideal = ideal_speedup(SMOL, n, RunSetting(LAST_THIRD))
    assert ideal_speedup(SMOL, n, RunSetting(LAST_THIRD, "static")) > pop_ideal
    assert ideal_speedup(SMOL, n, RunSetting(LAST_THIRD, "pop_repair")) == pop_ideal
    with pytest.raises(ValueError, match="unknown variant"):
        prefill_ops(SMOL, n, RunSetting(LAST_THIRD, "turbo"))


def test_interleaved_skip_runs_kept_upper_layers_over_the_prompt_and_the_boundary():
    ops = [o.name for o in prefill_ops(SMOL, 16, RunSetting((10, 20)))]
    assert ops.count("L15.gate_proj") == 2, "prompt pass + boundary step"
    assert ops.count("L5.gate_proj") == 1, "below the first skipped layer: shared trunk"
    assert ops.count("L10.gate_proj") == 1 and ops.count("L10.k_proj") == 2


def test_batch_shares_the_weights():
    one = roofline_speedup(SMOL, 32, RunSetting(LAST_THIRD), rates(), batch=1)
    eight = roofline_speedup(SMOL, 32, RunSetting(LAST_THIRD), rates(), batch=8)
    assert eight > one, "weight reads are shared by the batch, so less of the time is fixed"


def test_rate_curve_interpolates_in_log_rows():
    r = Rates((1, 16, 256), (10.0, 50.0, 200.0), 1.0, "t")
    assert r.flops_at(1) == 10 and r.flops_at(0) == 10 and r.flops_at(10_000) == 200
    assert r.flops_at(4) == pytest.approx(30.0) and r.peak_flops_per_s == 200


def test_machine_rates_are_measured_once_and_cached(tmp_path, monkeypatch):
    import torch

    import pop_analysis.speed.machine as machine

    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(machine, "matmul_rate", lambda dev, dt, shape, rows: 1e9 * rows)
    monkeypatch.setattr(machine, "bandwidth", lambda dev: 5e9)
    monkeypatch.setattr(machine, "_others", lambda: None)  # no probe: never busy
    first = machine_rates("cpu", torch.float32, 2, (64, 128))
    assert first.bytes_per_s == 5e9 and first.flops_at(4096) == 1e9 * 4096
    assert "2 threads | float32 | cpu | weight 64x128 | cold" in first.key

    def measured(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(machine, "matmul_rate", measured)
    assert machine_rates("cpu", torch.float32, 2, (64, 128)) == first
    (tmp_path / "machine" / "rates.json").write_text("{not json")
    monkeypatch.setattr(machine, "matmul_rate", lambda dev, dt, shape, rows: 2e9)
    assert machine_rates("cpu", torch.float32, 2, (64, 128)).flops_at(1) == 2e9, "corrupt: remeasure"


# Gemma-3-270M: five local layers (window 512) then one global, q/k norms, normed branches.
GEMMA = Shape(n_layers=18, hidden=640, n_heads=4, n_kv_heads=1, head_dim=256, intermediate=2048,
              vocab=262144, max_positions=32768, qk_norm=True, branch_norms=True,
              windows=tuple(None if i % 6 == 5 else 512 for i in range(18)))


def test_sliding_window_spans_equal_a_count_of_the_attended_keys():
    s = dataclasses.replace(GEMMA, windows=(5,) * 18)
    for past in range(12):
        for tokens in range(1, 12):
            queries = range(past + 1, past + tokens + 1)
            seen = [range(max(1, t - 4), t + 1) for t in queries]  # distance < W, itself included
            assert attention_span(s, 0, past, tokens) == (sum(map(len, seen)),
                                                          len(set().union(*seen)))
    assert attention_span(GEMMA, 5, 2047, 1) == (2048, 2048), "a global layer sees every key"


def test_gemma_counts_its_window_norms_and_large_lm_head():
    ops = {o.name: o for o in prefill_ops(GEMMA, 2048)}
    local, glob = ops["L0.attention"], ops["L5.attention"]
    assert local.flops == 4 * 1024 * (512 * 513 // 2 + (2048 - 512) * 512)
    assert glob.flops == 4 * 1024 * 2048 * 2049 // 2
    assert {"L0.q_norm", "L0.k_norm", "L0.post_attn_norm", "L0.post_ffn_norm"} <= set(ops)
    assert ops["lm_head"].flops == 2 * 640 * 262144, "one token through a 262k x 640 weight"
    skipped = [o.name for o in prefill_ops(GEMMA, 64, RunSetting(range(12, 18)))
               if o.name.startswith("L12.")]
    # the prompt's K/V projection norms k only; the boundary step runs the layer in full
    assert skipped.count("L12.k_norm") == 2 and skipped.count("L12.q_norm") == 1
    # the window caps local attention, so the full model gains less from long prompts
    assert ideal_speedup(GEMMA, 2048, RunSetting(range(12, 18))) < \
        ideal_speedup(dataclasses.replace(GEMMA, windows=()), 2048, RunSetting(range(12, 18)))


def test_rates_measured_on_a_busy_machine_are_not_kept(tmp_path, monkeypatch):
    import torch

    import pop_analysis.speed.machine as machine

    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(machine, "matmul_rate", lambda dev, dt, shape, rows: 1e9)
    monkeypatch.setattr(machine, "bandwidth", lambda dev: 5e9)
    clock = iter(range(0, 1000, 10))  # other processes: 10 CPU seconds per probe
    monkeypatch.setattr(machine, "_others", lambda: float(next(clock)))
    got = machine_rates("cpu", torch.float32, 2, (64, 128))
    assert got.busy and not (tmp_path / "machine" / "rates.json").exists()
    monkeypatch.setattr(machine, "_others", lambda: 0.0)
    assert not machine_rates("cpu", torch.float32, 2, (64, 128)).busy
    assert (tmp_path / "machine" / "rates.json").exists()


def test_the_matmul_rate_is_timed_on_weights_beyond_the_caches(monkeypatch):
    import torch

    import pop_analysis.speed.machine as machine

    seen = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w: seen.append(w.data_ptr()) or real(x, w))
    monkeypatch.setattr(machine, "COLD_BYTES", 64 * 128 * 4 * 3)  # three weights' worth
    assert machine.matmul_rate("cpu", torch.float32, (64, 128), 4, min_s=0.0) > 0
    assert len(seen) >= 4 and len(set(seen)) == 3, "every weight in turn"
    assert all(a != b for a, b in zip(seen, seen[1:])), "never the same weight twice in a row"
