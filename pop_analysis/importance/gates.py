"""Virtual gates: one scalar per sample, layer and stage that scales both residual branches.

    y_l     = x_l + g_l * Attn(LN1(x_l))
    x_{l+1} = y_l + g_l * FFN(LN2(y_l))

Sample b with prompt length N_b (0-indexed positions): positions 0..N_b-2 use the prefill gate,
N_b-1..T_b-2 (the last prompt token, then every response token that predicts the next one) use the
decode gate. The last token and padding predict nothing scored: they get a constant 1, so no
gradient leaks through them. Gates at 1 multiply by exactly 1.0 and leave every value unchanged.
Hooks live in `with` blocks; the graph they build stays valid for backward() inside the block.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.hooks import Hooks

PREFILL, DECODE, NONE = 0, 1, 2  # stage codes per position


def stage_map(prompt_lens, lengths, width: int) -> torch.Tensor:
    """Stage code per position of a right-padded batch: (B, T) long.

    prompt_lens, lengths: per-sample prompt and total (prompt + response) lengths.
    """
    n = torch.as_tensor(prompt_lens).view(-1, 1)  # (B, 1)
    t = torch.as_tensor(lengths).view(-1, 1)  # (B, 1)
    if bool((n < 1).any()) or bool((t < n).any()) or bool((t > width).any()):
        raise ValueError("each sample needs 1 <= prompt length <= total length <= padded width")
    pos = torch.arange(width).view(1, -1)  # (1, T)
    codes = torch.full((n.shape[0], width), NONE, dtype=torch.long)  # (B, T)
    codes[pos < n - 1] = PREFILL
    codes[(pos >= n - 1) & (pos < t - 1)] = DECODE
    return codes  # (B, T)


@dataclass
class StageGates:
    """Gate leaves, one per sample and layer and stage; their .grad is dL/dg after backward."""

    prefill: torch.Tensor  # (B, L)
    decode: torch.Tensor  # (B, L)

    @classmethod
    def ones(cls, batch: int, n_layers: int, device=None, requires_grad: bool = True,
             dtype=torch.float32):
        def leaf():
            g = torch.ones(batch, n_layers, device=device, dtype=dtype)  # (B, L)
            return g.requires_grad_(requires_grad)
        return cls(prefill=leaf(), decode=leaf())

    def values(self, stages: torch.Tensor) -> torch.Tensor:
        """Gate per sample, position and layer: (B, T, L)."""
        stages = stages.to(self.prefill.device)
        dt = self.prefill.dtype
        pre = (stages == PREFILL).unsqueeze(-1).to(dt)  # (B, T, 1)
        dec = (stages == DECODE).unsqueeze(-1).to(dt)  # (B, T, 1)
        rest = (stages == NONE).unsqueeze(-1).to(dt)  # (B, T, 1)
        return pre * self.prefill[:, None, :] + dec * self.decode[:, None, :] + rest  # (B, T, L)


def _scaled(out, scale: torch.Tensor):
    """Multiply a module's output (attention returns (output, weights): scale the output only)."""
    if isinstance(out, tuple):
        return (_scaled(out[0], scale), *out[1:])
    if out.shape[:2] != scale.shape[:2]:
        raise ValueError(f"gate shape {tuple(scale.shape[:2])} does not match output "
                         f"{tuple(out.shape[:2])}")
    return out * scale.to(out.device, out.dtype)  # (B, T, D)


@contextmanager
def gated(adapter: DecoderAdapter, gates: StageGates, stages: torch.Tensor):
    """Within the block, every layer's attention and FFN branch outputs are scaled by their gate.

    stages (B, T) from stage_map must match the batch the model is run on.
    """
    g = gates.values(stages)  # (B, T, L)
    with Hooks() as hooks:
        for i in range(adapter.n_layers):
            scale = g[:, :, i:i + 1]  # (B, T, 1)
            hook = lambda mod, args, out, s=scale: _scaled(out, s)  # noqa: E731
            for branch in adapter.residual_branches(i):  # Gemma: the post-branch norms
                hooks.after(branch, hook)
        yield g


@contextmanager
def block_influence(adapter: DecoderAdapter):
    """Record ShortGPT's block influence 1 - cos(layer input, layer output) per token.

    Yields a dict layer -> (B, T) tensor (detached, float32), filled as the forward runs.
    """
    record: dict[int, torch.Tensor] = {}

    def hook(i):
        def fn(mod, args, kwargs, out):
            x, y = adapter.layer_io(args, kwargs, out)  # (B, T, D) each
            with torch.no_grad():
                cos = torch.nn.functional.cosine_similarity(x.float(), y.float(), dim=-1)  # (B, T)
                record[i] = (1.0 - cos).detach()
        return fn

    with Hooks() as hooks:
        for i in range(adapter.n_layers):
            hooks.after(adapter.layers[i], hook(i), with_kwargs=True)
        yield record


@contextmanager
def maybe_block_influence(adapter: DecoderAdapter, on: bool):
    """block_influence(adapter) when on, else yields None."""
    if not on:
        yield None
        return
    with block_influence(adapter) as record:
        yield record


@contextmanager
def frozen_weights(model):
    """No weight gradients while calibrating: backward flows to gates only (about half the cost)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


@contextmanager
def layer_ticks(adapter: DecoderAdapter, tick):
    """Call tick(message) as each layer runs forward, and again as backward passes through it."""
    L = adapter.n_layers

    def hook(i):
        def fn(mod, args, out):
            tick(f"forward layer {i + 1}/{L}")
            y = out[0] if isinstance(out, tuple) else out
            if y.requires_grad:
                y.register_hook(lambda grad: tick(f"backward layer {i + 1}/{L}"))
        return fn

    with Hooks() as hooks:
        for i in range(L):
            hooks.after(adapter.layers[i], hook(i))
        yield


def stage_means(values: torch.Tensor, stages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample means of (B, T) values over prefill and over decode positions: (B,), (B,).

    A sample without prefill positions (one-token prompt) gets 0 for prefill.
    """
    stages = stages.to(values.device)
    out = []
    for code in (PREFILL, DECODE):
        m = (stages == code).float()  # (B, T)
        out.append((values * m).sum(-1) / m.sum(-1).clamp(min=1.0))  # (B,)
    return out[0], out[1]
