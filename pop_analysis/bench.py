"""Timing: TTFT of full vs POP, measured alternately in one process, medians of repeats.

TTFT here is prompt tensor in -> first token id out, on the device, synchronised; for POP it
includes the boundary step (x_N through the full model). Timing does not depend on token
content, so prompts are seeded random ids.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .flops import ideal_speedup
from .generate import synchronize
from .models import LoadedModel
from .pop import check_prompt, run_prompt


def random_prompt(lm: LoadedModel, length: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vocab = lm.adapter.shape.vocab
    ids = torch.randint(min(100, vocab - 1), vocab, (batch, length), generator=g)  # (B, N)
    return ids.to(lm.device)


def ttft_once(lm: LoadedModel, ids: torch.Tensor, variant: str, skip) -> float:
    synchronize(lm.device)
    t0 = time.perf_counter()
    first = run_prompt(lm.adapter, ids, variant, skip)
    first.logits.argmax(-1).tolist()  # the first token reaches the host
    synchronize(lm.device)
    return time.perf_counter() - t0


@torch.inference_mode()
def hf_ttft_once(lm: LoadedModel, ids: torch.Tensor) -> float:
    """The same measurement through HF's own forward (logits for the last position only)."""
    synchronize(lm.device)
    t0 = time.perf_counter()
    out = lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
    out.logits[:, -1].argmax(-1).tolist()
    synchronize(lm.device)
    return time.perf_counter() - t0


@dataclass
class BenchRow:
    length: int  # prompt tokens
    ttft_full_ms: float  # median
    ttft_pop_ms: float  # median
    speedup: float  # full / pop, of the medians
    ideal_speedup: float  # from FLOP counts
    ttft_hf_ms: float | None = None  # HF's own forward, when asked

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def bench_length(lm: LoadedModel, length: int, skip, repeats: int = 5, warmup: int = 1,
                 with_hf: bool = False, batch: int = 1) -> BenchRow:
    """Alternate full and POP (and HF) `repeats` times after `warmup` untimed rounds."""
    check_prompt(lm.adapter, length)
    ids = random_prompt(lm, length, batch=batch)
    times: dict[str, list[float]] = {"full": [], "pop": [], "hf": []}
    for r in range(warmup + repeats):
        rnd = {"full": ttft_once(lm, ids, "full", skip), "pop": ttft_once(lm, ids, "pop", skip)}
        if with_hf:
            rnd["hf"] = hf_ttft_once(lm, ids)
        if r >= warmup:
            for k, v in rnd.items():
                times[k].append(v)
    full, pop = statistics.median(times["full"]), statistics.median(times["pop"])
    hf = statistics.median(times["hf"]) * 1e3 if with_hf else None
    return BenchRow(length, full * 1e3, pop * 1e3, full / pop,
                    ideal_speedup(lm.adapter.shape, length, skip), hf)


def bench(lm: LoadedModel, lengths, skip, repeats: int = 5, with_hf: bool = False,
          on_row=None) -> list[BenchRow]:
    rows = []
    for n in lengths:
        rows.append(bench_length(lm, n, skip, repeats, with_hf=with_hf))
        if on_row:
            on_row(rows[-1])
    return rows
