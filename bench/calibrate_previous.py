"""The calibration algorithm as it was before the one-pass path (fisher.py), kept as the baseline
the benchmarks time side by side with the current one. Not used by the library.

Per batch of prompts (sorted by length, as now): sample with a left-padded batch and a plain
DynamicCache (the whole prompt in one forward, then one decode step per token, lm_head on the last
position), then pack [prompt ; response] and run calibrate.gate_gradients (one teacher-forced gated
forward + backward over every position, lm_head where a loss is taken).
"""
from __future__ import annotations

import torch

from pop_analysis.engine.generate import SamplingConfig, eos_ids, pick
from pop_analysis.importance.calibrate import gate_gradients, pack, sample_seed
from pop_analysis.importance.fisher import left_pad


@torch.inference_mode()
def sample_previous(lm, prompts: list[list[int]], seeds: list[int], cfg) -> list[list[int]]:
    """Batched sampling as before: full prompt forward, then decode steps on a DynamicCache."""
    adapter = lm.adapter
    dev = adapter.device
    scfg = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                          top_p=cfg.top_p)
    gens = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
    ids, mask, pos = left_pad(prompts, dev)  # (B, N) each
    cache = adapter.new_cache()
    h = adapter.forward_padded(ids, mask, pos, cache)  # (B, N, D)
    stop = eos_ids(lm)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    last = pos[:, -1:]  # (B, 1)
    for step in range(cfg.max_new_tokens):
        logits = adapter.head(h[:, -1, :]).float().cpu()  # (B, V)
        nxt = torch.zeros(len(prompts), 1, dtype=torch.long)  # (B, 1)
        for b in range(len(prompts)):
            if not done[b]:
                nxt[b, 0] = pick(logits[b:b + 1], scfg, gens[b])[0, 0]
                out[b].append(int(nxt[b, 0]))
                done[b] = int(nxt[b, 0]) in stop
        if all(done) or step + 1 == cfg.max_new_tokens:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, S+1)
        last = last + 1  # (B, 1)
        h = adapter.forward_padded(nxt.to(dev), mask, last, cache)  # (B, 1, D)
    return out


def calibrate_previous(lm, prompt_ids: list[list[int]], cfg) -> dict:
    """Squared gate gradients per sample as the previous algorithm computed them:
    {"prefill": (n, L), "decode": (n, L), "responses": [n lists]} (float64 scores)."""
    n, L = len(prompt_ids), lm.adapter.n_layers
    order = sorted(range(n), key=lambda i: len(prompt_ids[i]))
    out = {"prefill": torch.zeros(n, L, dtype=torch.float64),
           "decode": torch.zeros(n, L, dtype=torch.float64), "responses": [[] for _ in range(n)]}
    for lo in range(0, n, cfg.batch_size):
        idx = order[lo:lo + cfg.batch_size]
        prompts = [prompt_ids[i] for i in idx]
        responses = sample_previous(lm, prompts, [sample_seed(cfg.seed, i) for i in idx], cfg)
        g = gate_gradients(lm, pack(prompts, responses, lm.adapter.device))
        for k in ("prefill", "decode"):
            out[k][idx] = g[k].double() ** 2
        for i, r in zip(idx, responses):
            out["responses"][i] = r
    return out
