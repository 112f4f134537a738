"""Self-healing POP: the pruned prefill's first token now, the full model's exact cache later.

Let f be the first skipped layer. Below f, POP and the full model compute the same thing at every
position, so the hidden state entering layer f is exact everywhere: for the prompt (the shared
trunk of `run_prompt`) and for every decode token. From f up, the prompt positions saw a changed
stream: skipped layers passed it through, and every layer above f, kept ones of a non-contiguous
skip set included, computed its K/V from it; x_N and the decode tokens that follow attend to those
rows, so their own rows above f drift too. Healing re-runs layers f..L-1 (all of them, not only
the skipped ones) over every position so far, in order and in chunks: each chunk starts from the
exact layer-f input, attends causally to the rows already healed (kept in a cache of the healer's
own, which also keeps what a sliding window has dropped from the request's cache but a later chunk
still needs), and its K/V replace the request's cache rows in place. Positions healed are a prefix,
and a healed prefix is the full model's cache for that prefix. Decode tokens produced while healing
is under way keep their layer-f input and join the end of the queue; once the queue is empty, the
cache is the full model's cache for the same token sequence and decode runs unchanged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.pop import FirstStep, decode_step, padding, run_layers, run_prompt
from pop_vllm.healing import Heal
from pop_vllm.run_setting import RunSetting

PROBE = 8  # positions of the first chunk under a time budget, before a per-position cost is known


@dataclass(frozen=True)
class HealChunk:
    """One healing pass: layers first..L-1 over positions [start, end) before decode step `step`."""

    step: int  # decode steps already run (0: right after the first token)
    start: int
    end: int
    ms: float


class Healer:
    """The healing state of one request (a batch of rows sharing positions)."""

    def __init__(self, adapter: DecoderAdapter, heal: Heal, first: FirstStep, first_layer: int):
        self.adapter, self.heal, self.cache = adapter, heal, first.cache
        self.first_layer = first_layer  # f: every layer from here up is re-run
        self.prompt_pad = first.attention_mask  # (B, N) or None
        self.done = 0  # positions healed (a prefix)
        self.total = first.position  # positions in the cache
        self.queue = [] if first.trunk is None else [first.trunk]  # layer-f inputs of [done, total)
        self.scratch = adapter.new_cache()  # the healed rows of layers f..L-1, as attended
        self.chunks: list[HealChunk] = []
        self.steps = 0  # decode steps run so far
        self.ms_per_position: float | None = None
        self.horizon: int | None = None  # tokens out when the cache became exact
        if first_layer >= adapter.n_layers:  # nothing differs from the full model
            self.done, self.queue, self.horizon = self.total, [], 0

    @property
    def finished(self) -> bool:
        return self.done == self.total

    # --- healing ---
    def before_step(self, tokens_out: int, counts=None, stage: str = "heal") -> None:
        """Heal what the policy allows before the next decode step (tokens_out already out);
        the chunks run under `stage` on `counts` (a step-through names each step's own)."""
        if self.finished:
            return
        h = self.heal
        if h.policy == "eager":
            self._heal_upto(self.total, counts, stage)
        elif h.budget_positions is not None:
            self._heal_upto(min(self.total, self.done + h.budget_positions), counts, stage)
        else:
            self._heal_for(h.budget_ms, counts, stage)
        if self.finished:
            self.horizon = tokens_out

    def _heal_upto(self, end: int, counts, stage: str) -> None:
        while self.done < end:
            self._chunk(min(self.heal.chunk, end - self.done), counts, stage)

    def _heal_for(self, budget_ms: float, counts, stage: str) -> None:
        """Chunks while the estimated cost fits the budget; at least two positions a step, so
        healing outruns the one position each decode step adds."""
        t0, healed = time.perf_counter(), 0
        while not self.finished:
            left = budget_ms - (time.perf_counter() - t0) * 1e3
            n = PROBE if self.ms_per_position is None else int(left / self.ms_per_position)
            n = min(n, self.heal.chunk, self.total - self.done)
            if healed >= 2 and n < 1:
                break
            n = max(n, 2 - healed, 1)
            self._chunk(min(n, self.total - self.done), counts, stage)
            healed += n

    @torch.inference_mode()
    def _chunk(self, n: int, counts, stage: str) -> None:
        a, b = self.done, self.done + n
        t0 = time.perf_counter()
        before = getattr(counts, "stage", None)
        if counts is not None:
            counts.stage = stage
        h = self._take(n)  # (B, n, D)
        pad = self._pad(b)  # (B, b) or None
        pos = self.adapter.positions(a, n, h.shape[0], pad)  # (B, n)
        layers = range(self.first_layer, self.adapter.n_layers)
        run_layers(self.adapter, h, pos, self.scratch, pad, layers)
        for i in layers:
            self._write_back(i, a, b)
        self.done = b
        if counts is not None:
            counts.stage = before
        ms = (time.perf_counter() - t0) * 1e3
        self.ms_per_position = ms / n
        self.chunks.append(HealChunk(self.steps, a, b, ms))

    def _take(self, n: int) -> torch.Tensor:
        """The layer-f inputs of the next n positions, removed from the queue: (B, n, D)."""
        got, need = [], n
        while need:
            head = self.queue[0]  # (B, t, D)
            got.append(head[:, :need])
            if head.shape[1] <= need:
                self.queue.pop(0)
            else:
                self.queue[0] = head[:, need:]
            need -= got[-1].shape[1]
        return got[0] if len(got) == 1 else torch.cat(got, dim=1)

    def _pad(self, b: int):
        """The padding mask of positions [0, b): the prompt's, then decode tokens (all real)."""
        p = self.prompt_pad
        if p is None:
            return None
        extra = torch.ones((p.shape[0], max(0, b - p.shape[1])), dtype=p.dtype, device=p.device)
        return torch.cat([p, extra], dim=1)[:, :b]

    def _write_back(self, i: int, a: int, b: int) -> None:
        """Copy the healed rows of positions [a, b) into layer i's cache where it holds them.

        The request's cache holds the last rows of positions [0, seen) (all of them, or a
        sliding window's); the healer's holds the last rows of [0, b)."""
        ad = self.adapter
        dst, src = ad.cached_kv(self.cache, i), ad.cached_kv(self.scratch, i)
        dst_lo = ad.seen_length(self.cache, i) - dst[0].shape[-2]
        src_lo = b - src[0].shape[-2]
        lo = max(a, dst_lo, src_lo)
        if lo >= b:
            return
        for d, s in zip(dst, src):  # keys, then values: (B, Hkv, S, Dh)
            d[:, :, lo - dst_lo:b - dst_lo] = s[:, :, lo - src_lo:b - src_lo]

    # --- decoding beside it ---
    @torch.inference_mode()
    def decode(self, ids: torch.Tensor, position: int, mask=None) -> torch.Tensor:
        """One decode step (B, 1) at `position`: logits (B, V). While healing is unfinished the
        token's layer-f input joins the queue (its rows above f attend to unhealed ones)."""
        self.steps += 1
        if self.finished:  # everything before it is healed: its rows are exact
            self.done = self.total = self.total + 1
            return decode_step(self.adapter, ids, self.cache, position, (), mask)
        self.total += 1
        ad = self.adapter
        pad = padding(mask, ids.shape[0], position + 1)  # (B, position+1) or None
        h = ad.embed(ids)  # (B, 1, D)
        pos = ad.positions(position, 1, ids.shape[0], pad)  # (B, 1)
        h = run_layers(ad, h, pos, self.cache, pad, range(self.first_layer))
        self.queue.append(h)
        h = run_layers(ad, h, pos, self.cache, pad, range(self.first_layer, ad.n_layers))
        return ad.logits(h)[:, -1, :].float()  # (B, V)

    def report(self) -> dict:
        """What healing did so far: the settings, the horizon, the positions and each step's time."""
        per_step: dict[int, float] = {}
        for c in self.chunks:
            per_step[c.step] = per_step.get(c.step, 0.0) + c.ms
        return {**self.heal.as_dict(), "first_layer": self.first_layer,
                "horizon_tokens": self.horizon, "healed_positions": self.done,
                "positions": self.total, "finished": self.finished, "chunks": len(self.chunks),
                "heal_ms_per_step": [round(per_step.get(s, 0.0), 3)
                                     for s in range(max(per_step, default=-1) + 1)]}


@torch.inference_mode()
def heal_prompt(adapter: DecoderAdapter, ids: torch.Tensor, setting: RunSetting, counts=None,
                attention_mask=None):
    """`run_prompt` plus the healer that will make its cache exact by `setting.heal`:
    (FirstStep, Healer | None). f, the lowest layer whose rows POP computes differently, is the
    first skipped layer (L when none is)."""
    heal = setting.heal
    first = run_prompt(adapter, ids, setting, counts, attention_mask, keep_trunk=heal.active)
    if not heal.active:
        return first, None
    return first, Healer(adapter, heal, first, setting.first_skipped(adapter.n_layers))


@torch.inference_mode()
def heal_greedy(adapter: DecoderAdapter, first: FirstStep, healer: Healer | None,
                max_new_tokens: int = 16, on_step=None) -> torch.Tensor:
    """Greedy tokens (B, T) from `heal_prompt`'s result, healing by its policy between steps.
    `on_step(tokens_out)` runs after the first token and after each decode step (the cache is
    then as that step left it)."""
    mask = first.attention_mask  # (B, N) or None
    nxt = first.logits.argmax(-1, keepdim=True)  # (B, 1)
    out, position = [nxt], first.position
    if on_step is not None:
        on_step(1)
    for _ in range(max_new_tokens - 1):
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, position+1)
        if healer is None:
            logits = decode_step(adapter, nxt.to(adapter.device), first.cache, position, (), mask)
        else:
            healer.before_step(len(out))
            logits = healer.decode(nxt.to(adapter.device), position, mask)
        nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
        out.append(nxt)
        position += 1
        if on_step is not None:
            on_step(len(out))
    return torch.cat(out, dim=1).cpu()  # (B, T)
