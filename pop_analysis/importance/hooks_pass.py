"""Every forward-only importance metric from ONE pass over the prompts, with hooks.

Block l maps x (its input) to y = x + a + m: a the attention branch and m the MLP branch as added
to the residual stream (Gemma: after their post-norms; adapter.residual_branches). Per token:

    Block Influence     bi   = 1 - cos(x, y)
    sub-layer cosine    attn = 1 - cos(x, x + a),  mlp = 1 - cos(x + a, y)
    relative magnitude  mag  = ‖y - x‖ / ‖y‖
    angular distance    d(l, n) = arccos(cos(h_l, h_l+n)) / π on the last prompt token, h_l the
                        input of block l and h_L the last block's output (before the final norm)

1 - cos is computed as ‖x̂ - ŷ‖² / 2 and the angle as 2·atan2(‖û - v̂‖, ‖û + v̂‖): both exactly 0
for an unchanged vector, where 1 - cos and arccos lose every digit to rounding.
Positions: "prefill" = the prompt positions 0..N-2 (mean), "decode" = the last prompt position
N-1 (the one POP runs in full); no response is sampled. A one-token prompt has no prefill
position and scores 0 there.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from pop_analysis.engine.hooks import Hooks
from pop_analysis.importance.batch_plan import plan_batches
from pop_analysis.importance.gates import DECODE, NONE, PREFILL, stage_means

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

ROWS = 16  # prompts per forward
SERIES = ("bi.prefill", "bi.decode", "sublayer.attention", "sublayer.mlp", "sublayer.block",
          "magnitude.prefill", "magnitude.decode", "angular.last")
TOKENS = ("prefill: the prompt positions before the last (chat template included), mean per "
          "prompt; decode and angular: the last prompt token")


def one_minus_cos(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """1 - cos over the last dimension, as ‖û - v̂‖² / 2: (..., D) -> (...)."""
    return 0.5 * (_unit(u) - _unit(v)).pow(2).sum(-1)


def angle(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """arccos(cos(u, v)) / π over the last dimension, in [0, 1]: (..., D) -> (...)."""
    a, b = _unit(u), _unit(v)
    return 2.0 * torch.atan2((a - b).norm(dim=-1), (a + b).norm(dim=-1)) / math.pi


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def stage_codes(prompt_lens: list[int], width: int) -> torch.Tensor:
    """PREFILL before each prompt's last token, DECODE on it, NONE on padding: (B, T)."""
    n = torch.tensor(prompt_lens).view(-1, 1)  # (B, 1)
    pos = torch.arange(width).view(1, -1)  # (1, T)
    codes = torch.full((len(prompt_lens), width), NONE, dtype=torch.long)  # (B, T)
    codes[pos < n - 1] = PREFILL
    codes[pos == n - 1] = DECODE
    return codes


class _Recorder:
    """Per-layer statistics of one batch, filled by the hooks as the forward runs."""

    def __init__(self, codes: torch.Tensor, last: torch.Tensor):
        self.codes, self.last = codes, last  # (B, T), (B,) index of each prompt's last token
        self.branch: dict[int, list[torch.Tensor]] = {}
        self.stats: dict[str, list[torch.Tensor]] = {k: [] for k in SERIES if k != "angular.last"}
        self.states: list[torch.Tensor] = []  # last-token h_0 .. h_L, (B, D) each

    def on_branch(self, i: int, out) -> None:
        y = out[0] if isinstance(out, tuple) else out
        self.branch.setdefault(i, []).append(y.detach())

    def on_layer(self, i: int, x: torch.Tensor, y: torch.Tensor) -> None:
        a, _m = self.branch.pop(i)  # (B, T, D) each
        x, y, a = x.detach().float(), y.detach().float(), a.float()  # (B, T, D)
        mid = x + a  # (B, T, D) the residual stream between the sub-layers
        per_token = {"bi": one_minus_cos(x, y), "attention": one_minus_cos(x, mid),
                     "mlp": one_minus_cos(mid, y),
                     "magnitude": (y - x).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-30)}  # (B, T)
        codes = self.codes.to(x.device)
        for name in ("bi", "magnitude"):
            pre, dec = stage_means(per_token[name], codes)  # (B,), (B,)
            self.stats[f"{name}.prefill"].append(pre.cpu())
            self.stats[f"{name}.decode"].append(dec.cpu())
        attn, mlp = (stage_means(per_token[k], codes)[0].cpu() for k in ("attention", "mlp"))
        self.stats["sublayer.attention"].append(attn)
        self.stats["sublayer.mlp"].append(mlp)
        self.stats["sublayer.block"].append(torch.maximum(attn, mlp))
        rows = torch.arange(x.shape[0], device=x.device)
        if i == 0:
            self.states.append(x[rows, self.last.to(x.device)].double().cpu())  # (B, D)
        self.states.append(y[rows, self.last.to(x.device)].double().cpu())  # (B, D)

    def result(self) -> dict[str, torch.Tensor]:
        out = {k: torch.stack(v, dim=1).double() for k, v in self.stats.items()}  # (B, L) each
        tri = triangle(torch.stack(self.states, dim=1))  # (B, L, L)
        out["angular.last"] = tri[:, :, 0]  # (B, L): n = 1
        out["triangle"] = tri
        return out


def triangle(h: torch.Tensor) -> torch.Tensor:
    """d(l, n) for hidden states h (B, L+1, D) of one token: (B, L, L), [b, l, n-1] filled for
    n = 1..L-l, NaN elsewhere."""
    B, L = h.shape[0], h.shape[1] - 1
    out = torch.full((B, L, L), float("nan"), dtype=torch.float64)  # (B, L, L)
    for n in range(1, L + 1):
        out[:, :L + 1 - n, n - 1] = angle(h[:, :L + 1 - n], h[:, n:])  # (B, L+1-n)
    return out


@contextmanager
def recording(adapter, rec: _Recorder):
    """Branch and layer hooks that feed `rec`; removed on the way out."""
    with Hooks() as hooks:
        for i in range(adapter.n_layers):
            for branch in adapter.residual_branches(i):
                hooks.after(branch, lambda mod, args, out, i=i: rec.on_branch(i, out))
            hooks.after(adapter.layers[i], lambda mod, args, kwargs, out, i=i: rec.on_layer(
                i, *adapter.layer_io(args, kwargs, out)), with_kwargs=True)
        yield rec


@torch.inference_mode()
def forward_metrics(lm: LoadedModel, prompt_ids: list[list[int]], rows: int = ROWS,
                    tick=None) -> dict:
    """Per-sample, per-layer values of every series in SERIES, (n, L) float64 each, and the
    angular triangle (n, L, L), in prompt order. tick(done) hears each finished batch."""
    if not prompt_ids or min(len(p) for p in prompt_ids) < 1:
        raise ValueError("forward-only metrics need at least one prompt of at least one token")
    adapter = lm.adapter
    parts: dict[int, dict] = {}
    for idx in plan_batches([len(p) for p in prompt_ids], rows):
        batch = [prompt_ids[i] for i in idx]
        lens = [len(p) for p in batch]
        width = max(lens)
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T) right-padded
        mask = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T)
        for b, p in enumerate(batch):
            ids[b, :len(p)], mask[b, :len(p)] = torch.tensor(p), 1
        rec = _Recorder(stage_codes(lens, width), torch.tensor(lens) - 1)
        with recording(adapter, rec):
            adapter.forward_padded(ids.to(adapter.device), mask.to(adapter.device))  # (B, T, D)
        got = rec.result()
        for b, i in enumerate(idx):
            parts[i] = {k: v[b] for k, v in got.items()}
        if tick:
            tick(len(idx))
    return {k: torch.stack([parts[i][k] for i in range(len(prompt_ids))]) for k in parts[0]}
