"""The paper's Tables 3 and 4 reproduced on one model, n items per cell with 95% intervals, plus
the retrieval check of the full model and multiple choice through lm-eval.

Each part is a cached sweep (store.py), so parts can be computed one at a time (each holding the
CPU for a bounded stretch) and the report rendered from the cache (report_render.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import preset
from pop_analysis.experiments.sweep import SweepConfig, cached_sweep
from pop_analysis.quality.evaluate import Arm
from pop_analysis.store import results as store
from pop_vllm.run_setting import RunSetting


@dataclass(frozen=True)
class ReportConfig:
    """What the report measures; hashed into every part's cache key."""

    n: int = 200  # items per cell of Tables 3 and 4 (GSM8K answers and retrieval)
    retrieval_length: int = 512  # prompt tokens of the tables' retrieval column
    lengths: tuple[int, ...] = (512, 2048)  # prompt lengths of the full-vs-POP retrieval check
    length_n: int = 50  # retrieval items per length in that check
    mc_n: int = 200  # documents per multiple-choice task
    greedy_tokens: int = 0  # greedy tokens compared on GSM8K (0: teacher-forced metrics only)
    repeats: int = 3  # timed rounds per speedup
    bench_tokens: int = 512  # prompt length of the timed speedups
    seed: int = 0  # retrieval task seed


# part -> (sweep kind, data set: "gsm8k" or "retrieval"); "mc" runs through lm-eval instead
PARTS = {"table3": ("ablation", "gsm8k"), "table3_retrieval": ("ablation", "retrieval"),
         "table4": ("ratio", "gsm8k"), "table4_retrieval": ("ratio", "retrieval"),
         "length": ("length", "retrieval"), "mc": (None, None)}


class ReportError(ValueError):
    """A report that cannot be made as asked."""


def sweep_config(part: str, cfg: ReportConfig) -> SweepConfig:
    kind, data = PARTS[part]
    common = dict(repeats=cfg.repeats, bench_tokens=cfg.bench_tokens, seed=cfg.seed)
    if kind == "length":
        return SweepConfig(lengths=tuple(cfg.lengths), n_samples=cfg.length_n, **common)
    if data == "retrieval":
        return SweepConfig(dataset=f"retrieval:{cfg.retrieval_length}", n_samples=cfg.n,
                           max_new_tokens=8, **common)
    return SweepConfig(dataset="gsm8k", n_samples=cfg.n, max_new_tokens=max(cfg.greedy_tokens, 1),
                       greedy=cfg.greedy_tokens > 0, **common)


def mc_variants(n_layers: int) -> list[Arm]:
    """Multiple choice compares POP (the paper's last third) with the full model."""
    return [Arm("pop", RunSetting(preset("paper", n_layers)))]


def part_result(lm: LoadedModel, part: str, cfg: ReportConfig, compute: bool = True,
                use_cache: bool = True, progress=None) -> dict | None:
    """One part's stored result (computed on a miss when `compute`), as a plain dict."""
    if part not in PARTS:
        raise ReportError(f"unknown report part {part!r}; choose from {', '.join(PARTS)}")
    kind, _ = PARTS[part]
    if kind is not None:
        res, _ = cached_sweep(lm, kind, sweep_config(part, cfg), use_cache and compute, progress,
                              compute_missing=compute)
        return res.to_dict() if res is not None else None
    params = {"model": lm.name, "device": str(lm.device), "dtype": str(lm.dtype), "part": part,
              "n": cfg.mc_n, "variants": [dataclasses.asdict(v) for v in mc_variants(lm.adapter.n_layers)]}
    if not compute:
        return store.load("report", store.make_key(params))
    return store.cached("report", params, lambda: _mc(lm, cfg), use_cache)[0]


def _mc(lm: LoadedModel, cfg: ReportConfig) -> dict:
    import time

    import torch

    from pop_analysis.harness.mc import LOCAL_TASKS, mc_compare

    t0 = time.perf_counter()
    rows = mc_compare(lm, mc_variants(lm.adapter.n_layers), LOCAL_TASKS, cfg.mc_n)
    return {"rows": rows, "seconds": time.perf_counter() - t0, "data": "lm-eval local tasks",
            "threads": torch.get_num_threads(), "device": str(lm.device)}


def collect(lm: LoadedModel, cfg: ReportConfig, compute=(), use_cache: bool = True,
            progress=None) -> dict[str, dict | None]:
    """Every part: computed when named in `compute`, else loaded from the cache (None if absent)."""
    return {p: part_result(lm, p, cfg, p in compute, use_cache, progress) for p in PARTS}
