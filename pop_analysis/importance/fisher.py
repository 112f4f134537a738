"""Sample responses and take the virtual-gate gradients in one pass per batch.

The teacher-forced reference (calibrate.gate_gradients) samples [prompt ; response] first, then runs
it forward again with gates and autograd. Here the work is split at the prompt/response boundary so
that nothing runs twice. For a batch of prompts left-padded to width W:

1. prompt positions 0..W-2 run forward once, gated by the prefill gates, with autograd on; their
   K/V (a graph on the gates) stay in the cache;
2. sampling: the boundary token (column W-1) and each sampled token run as batched decode steps
   without autograd, on a detached copy of that cache; each step's logits z give the next token
   (generate.pick, one generator per row) and the loss terms of the token y it picked: the
   cross-entropy logsumexp(z) - z_y and its gradient softmax(z) - onehot(y);
3. [boundary ; response[:-1]] runs forward once with the decode gates and autograd on, attending to
   the prompt K/V of step 1; its final hidden states receive dL/dh through lm_head
   (adapter.head_vjp) and one backward carries it to both gate sets.

It is the reference's graph cut in two, so dL/dg is the same (tests compare both in float64 on every
family), minus a second forward over the prompt and the lm_head + log-softmax over the response
(the sampling steps computed those logits already). The sampled tokens are those of
sample_responses (the same steps with gates=None).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from pop_analysis.engine.generate import SamplingConfig, eos_ids, pick
from pop_analysis.engine.models import LoadedModel
from pop_analysis.importance.fewrows import few_rows
from pop_analysis.importance.gates import (DECODE, NONE, PREFILL, StageGates, frozen_weights, gated,
    layer_ticks, maybe_block_influence, stage_means)

FLUSH_ROWS = 256  # dL/dlogits rows kept before they go through lm_head's weight (bounds memory)
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Two threads for the per-row picks: each row draws from its own generator, so the order in
    which rows run cannot change a token, and torch releases the GIL inside the draws."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(2, thread_name_prefix="pick")
    return _POOL


def left_pad(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids (B, W), mask (B, W) with 1 = real token, positions (B, W) counting real tokens only."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, W)
    return ids, mask, pos


class _LossTerms:
    """Per-step cross-entropy of the picked tokens and dL/dh, gathered while sampling."""

    def __init__(self, adapter, batch: int, dtype):
        self.adapter, self.dtype = adapter, dtype
        self.loss = torch.zeros(batch, dtype=dtype)  # (B,)
        self.where: list[tuple[int, int]] = []  # (row, step) of each dL/dh row, in order
        self.grads: list[torch.Tensor] = []  # flushed dL/dh blocks, (n, D) each
        self.pending: list[torch.Tensor] = []  # dL/d(lm_head output) blocks, (b, V) each
        self.n_pending = 0

    def add(self, step: int, logits: torch.Tensor, tokens: torch.Tensor, live: list[int]) -> None:
        z = logits[live].to(self.dtype)  # (b, V)
        y = tokens[live, 0].to(z.device)  # (b,)
        lse = torch.logsumexp(z, dim=-1)  # (b,)
        self.loss[live] += (lse - z.gather(1, y[:, None])[:, 0]).cpu()
        g = torch.exp(z - lse[:, None])  # (b, V) softmax
        g[torch.arange(len(live), device=g.device), y] -= 1.0  # dL/dz = softmax - onehot
        self.pending.append(self.adapter.logit_grad(logits[live], g))
        self.where += [(b, step) for b in live]
        self.n_pending += len(live)
        if self.n_pending >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.grads.append(self.adapter.head_vjp(torch.cat(self.pending)))  # (n, D)
        self.pending, self.n_pending = [], 0

    def grad_h(self, shape, dtype, device) -> torch.Tensor:
        """dL/dh for the response pass: (B, R, D), zero where no token is scored."""
        self.flush()
        out = torch.zeros(shape, dtype=dtype, device=device)  # (B, R, D)
        if self.where:
            rows = torch.tensor([b for b, _ in self.where], device=device)
            cols = torch.tensor([s for _, s in self.where], device=device)
            out[rows, cols] = torch.cat(self.grads).to(device, dtype)
        return out


@dataclass(frozen=True)
class Listeners:
    """Who hears a pass's progress: tick(message) each layer of the two gated forwards and of
    the backward; on_step(i) each sampled token i, and on_step(-1) the end of the prompt's pass."""

    tick: Callable[[str], None] | None = None
    on_step: Callable[[int], None] | None = None


@dataclass(frozen=True)
class _Boundary:
    """Where sampling starts: the boundary token (B, 1), the padding mask of the positions so
    far (B, S) and the token's positions (B, 1)."""

    token: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor


@torch.no_grad()
def _decode(lm: LoadedModel, cache, start: _Boundary, seeds, cfg, terms: _LossTerms | None,
            on_step) -> list[list[int]]:
    """Sample from the boundary token on; `cache` holds the K/V of the positions before it."""
    tok, mask, pos = start.token, start.mask, start.pos  # (B, 1), (B, S), (B, 1)
    adapter = lm.adapter
    dev = adapter.device
    scfg = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                          top_p=cfg.top_p)
    gens = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
    n = len(seeds)
    stop = eos_ids(lm)
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    with few_rows(lm.model):
        for step in range(cfg.max_new_tokens):
            h = adapter.forward_padded(tok.to(dev), mask, pos, cache)  # (B, 1, D)
            logits = adapter.head(h[:, -1, :])  # (B, V)
            live = [b for b in range(n) if not done[b]]
            nxt = _pick_rows(logits.float().cpu(), live, scfg, gens)  # (B, 1)
            if terms is not None:
                terms.add(step, logits, nxt, live)
            for b in live:
                out[b].append(int(nxt[b, 0]))
                done[b] = int(nxt[b, 0]) in stop
            if on_step is not None:
                on_step(step)
            if all(done) or step + 1 == cfg.max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, S+1)
            pos = pos + 1  # (B, 1)
            tok = nxt
    return out


def _pick_rows(logits: torch.Tensor, live: list[int], scfg: SamplingConfig, gens) -> torch.Tensor:
    """generate.pick for each live row with its own generator; finished rows get token 0."""
    nxt = torch.zeros(logits.shape[0], 1, dtype=torch.long)  # (B, 1)

    def run(rows):
        for b in rows:
            nxt[b, 0] = pick(logits[b:b + 1], scfg, gens[b])[0, 0]
    if len(live) < 4:
        run(live)
    else:
        for f in [_pool().submit(run, live[k::2]) for k in (0, 1)]:
            f.result()
    return nxt


def sample_and_gradients(lm: LoadedModel, prompts: list[list[int]], seeds: list[int], cfg,
                         gates: StageGates | None = None, influence: bool = False,
                         listeners: Listeners = Listeners()) -> tuple[list[list[int]], dict]:
    """Responses for a batch of prompts and, when `gates` are given, dL/dg into gates.*.grad.

    Returns (responses, extra): extra holds "loss" (B,) and, with influence, "bi_prefill" and
    "bi_decode" (B, L), on the CPU. Without gates it only samples (no autograd at all).
    Gates must be at 1: the sampling steps (and the loss they score) run the ungated model.
    """
    tick, on_step = listeners.tick, listeners.on_step
    if gates is not None and not all(bool((g == 1).all()) for g in (gates.prefill, gates.decode)):
        raise ValueError("sample_and_gradients takes the gradient at gates = 1 only")
    adapter = lm.adapter
    dev = adapter.device
    ids, mask, pos = left_pad(prompts, dev)  # (B, W) each
    B, W = ids.shape
    dtype = torch.promote_types(lm.dtype, torch.float32)
    cache = adapter.new_cache()
    grad_on = gates is not None
    extra: dict = {}
    prefill_stages = torch.where(mask[:, :-1].cpu() == 1, PREFILL, NONE)  # (B, W-1)
    if W > 1:
        with _pass(adapter, gates, prefill_stages, influence, tick) as bi:
            adapter.forward_padded(ids[:, :-1], mask[:, :-1], pos[:, :-1], cache)  # (B, W-1, D)
        if bi is not None:
            extra["bi_prefill"] = _stage_bi(bi, prefill_stages, adapter.n_layers, PREFILL)
    if on_step is not None:
        on_step(-1)  # the prompt's pass is done: progress displays time it apart from sampling
    terms = _LossTerms(adapter, B, dtype) if grad_on else None
    steps = adapter.fork_cache(cache, W + cfg.max_new_tokens)
    responses = _decode(lm, steps, _Boundary(ids[:, -1:], mask, pos[:, -1:]), seeds, cfg, terms,
                        on_step)
    del steps
    if not grad_on:
        return responses, extra
    R = max(len(r) for r in responses)
    inp = torch.zeros(B, R, dtype=torch.long)  # [boundary ; response[:-1]], right-padded
    real = torch.zeros(B, R, dtype=torch.long)  # (B, R)
    for b, r in enumerate(responses):
        inp[b, 0] = ids[b, -1]
        inp[b, 1:len(r)] = torch.tensor(r[:-1], dtype=torch.long)
        real[b, :len(r)] = 1
    stages = torch.where(real == 1, DECODE, NONE)  # (B, R)
    full_mask = torch.cat([mask[:, :-1], real.to(dev)], dim=1)  # (B, W-1+R)
    rpos = pos[:, -1:] + torch.arange(R, device=dev).view(1, -1)  # (B, R)
    with _pass(adapter, gates, stages, influence, tick) as bi:
        h = adapter.forward_padded(inp.to(dev), full_mask, rpos, cache)  # (B, R, D)
        grad_h = terms.grad_h(h.shape, h.dtype, h.device)  # (B, R, D)
        torch.autograd.backward(h, grad_h)
    extra["loss"] = terms.loss
    if bi is not None:
        extra["bi_decode"] = _stage_bi(bi, stages, adapter.n_layers, DECODE)
        extra.setdefault("bi_prefill", torch.zeros_like(extra["bi_decode"]))
    return responses, extra


@contextmanager
def _pass(adapter, gates, stages, influence: bool, tick):
    """One gated forward (and the backward inside it) with autograd on; plain no_grad without
    gates. Yields the block-influence record or None."""
    if gates is None:
        with torch.no_grad():
            yield None
        return
    with frozen_weights(adapter.model), torch.enable_grad(), gated(adapter, gates, stages), \
            maybe_block_influence(adapter, influence) as bi, layer_ticks(adapter, tick or _silent):
        yield bi


def _silent(message: str) -> None:
    pass


def _stage_bi(record: dict, stages: torch.Tensor, n_layers: int, code: int) -> torch.Tensor:
    """Per-sample mean block influence over the positions of one stage: (B, L)."""
    pick_stage = 0 if code == PREFILL else 1
    return torch.stack([stage_means(record[i].cpu(), stages)[pick_stage]
                        for i in range(n_layers)], dim=1)  # (B, L)
