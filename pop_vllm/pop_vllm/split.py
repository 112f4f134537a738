"""A POP step around one contiguous skipped block f..g, with vLLM's compiler on the heavy parts.

The layer loop of `models.PopMixin._pop_forward` runs eagerly, so in compiled mode a POP prefill
step would lose what compiling buys the full model. Here the step is cut where the token set
changes, and each piece is a module compiled by vLLM (`support_torch_compile`):

    lower  embedding + layers 0..f-1      every token of the step     compiled
    glue   K/V of the pruned tokens        pruned tokens               eager (10 small matmuls)
    block  layers f..g                     the full tokens only        compiled
    top    layers g+1..L-1                 every token (pruned: x_f)   compiled

The block runs under the full tokens' attention metadata and slot mapping; lower and top under
the step's own. In eager mode (`--enforce-eager`) the pieces simply run uncompiled: the same code
path, which is what the engine tests check token for token against POP Lab.

The pieces are built for the block the engine was started with (vLLM compiles each once, without
guards: a run-time switch to another skip set takes the eager loop instead). Each piece is its own
class whose forward's qualified name carries its layer range, because vLLM keys its on-disk
compile cache by that name: two ranges must never share an artifact.
"""
from __future__ import annotations

import copy
import types

import torch

from vllm.compilation.decorators import support_torch_compile

from .layer import TokenSplit, project_pruned_kv, swapped, write_kv

_DIMS_LOWER = {"input_ids": {0: "b"}, "positions": {0: "b"}}
_DIMS_SPAN = {"positions": {0: "b"}, "hidden": {0: "b"}, "residual": {0: "b"}}


class _Lower(torch.nn.Module):
    """Embedding and layers [start, end) of `model`: (T,) ids -> (hidden, residual) (T, D) each."""

    def __init__(self, *, vllm_config, model, start: int, end: int, prefix: str = ""):
        super().__init__()
        self._model = [model]  # boxed: the decoder's weights stay registered once, on the model
        self.start, self.end = start, end

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor):
        m = self._model[0]
        hidden = m.embed_input_ids(input_ids)  # (T, D)
        residual = None  # as in the stock forward: layer 0 starts the residual stream
        for i in range(self.start, self.end):
            hidden, residual = m.layers[i](positions, hidden, residual)
        if residual is None:  # no layer below the block: the pair (0, x) sums to x
            hidden, residual = torch.zeros_like(hidden), hidden
        return hidden, residual


class _Span(torch.nn.Module):
    """Layers [start, end) of `model` on (hidden, residual) (n, D) each."""

    def __init__(self, *, vllm_config, model, start: int, end: int, prefix: str = ""):
        super().__init__()
        self._model = [model]
        self.start, self.end = start, end

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor):
        m = self._model[0]
        for i in range(self.start, self.end):
            hidden, residual = m.layers[i](positions, hidden, residual)
        return hidden, residual


def _compiled_piece(base, dims, vllm_config, model, start: int, end: int):
    """An instance of a fresh subclass of `base` for layers [start, end), under vLLM's compiler."""
    name = f"Pop{base.__name__.strip('_')}_{start}_{end}"
    fwd = base.forward
    # A code object of its own: torch's compiled-code cache and vLLM's bytecode hook are keyed by
    # code object, and with guards dropped two pieces sharing one would run one graph.
    code = fwd.__code__.replace(co_qualname=f"{name}.forward")
    forward = types.FunctionType(code, fwd.__globals__, "forward", fwd.__defaults__, fwd.__closure__)
    forward.__qualname__ = f"{name}.forward"  # the on-disk compile cache's key (see above)
    cls = support_torch_compile(dynamic_arg_dims=dims)(type(name, (base,), {"forward": forward}))
    cfg = copy.copy(vllm_config)  # each compiled piece keeps its own compile state
    cfg.compilation_config = copy.copy(vllm_config.compilation_config)
    return cls(vllm_config=cfg, model=model, start=start, end=end)


def contiguous_block(skip) -> tuple[int, int] | None:
    """(f, g) when the skip set is one run of layers f..g, else None."""
    skip = sorted(skip)
    if not skip or skip[-1] - skip[0] + 1 != len(skip):
        return None
    return skip[0], skip[-1]


class Split:
    """The compiled pieces of one engine for its block f..g of an L-layer decoder."""

    def __init__(self, vllm_config, model, block: tuple[int, int]):
        f, g = block
        n = model.end_layer
        self.skip = tuple(range(f, g + 1))
        self.lower = _compiled_piece(_Lower, _DIMS_LOWER, vllm_config, model, 0, f)
        self.block = _compiled_piece(_Span, _DIMS_SPAN, vllm_config, model, f, g + 1)
        self.top = _compiled_piece(_Span, _DIMS_SPAN, vllm_config, model, g + 1, n) if g + 1 < n else None
        self.warm = False

    def pieces(self) -> list:
        return [p for p in (self.lower, self.block, self.top) if p is not None]

    def state(self) -> dict:
        """What the counters report: the block, and whether every piece runs compiled code."""
        return {"skip": list(self.skip),
                "compiled": all(not p.do_not_compile and getattr(p, "compiled", False)
                                for p in self.pieces())}

    def warm_up(self, model, input_ids, positions) -> None:
        """Compile every piece on the warm-up batch (vLLM's dummy run: many tokens, no metadata),
        so no request pays for it; the result is discarded."""
        if self.warm or positions.shape[-1] < 2:  # a 1-token first call would fix the size at 1
            return
        hidden, residual = self.lower(input_ids, positions)
        hidden, residual = self.block(positions, hidden, residual)
        if self.top is not None:
            self.top(positions, hidden, residual)
        self.warm = True

    def forward(self, model, input_ids, positions, tokens: TokenSplit, maps=None):
        """One POP step; returns the final-normed hidden states (T, D) (pruned rows unused).
        maps: layer -> the pruned tokens' K/V projection (pop_repair), else the layers' own."""
        full_idx, pruned_idx, ctx = tokens.full_idx, tokens.pruned_idx, tokens.ctx
        hidden_in, residual_in = self.lower(input_ids, positions)  # (T, D) each
        x = hidden_in + residual_in  # (T, D) x_f, what reaches the block
        x_pruned = x.index_select(0, pruned_idx)  # (P, D)
        pos_pruned = positions.index_select(0, pruned_idx)  # (P,)
        with swapped(ctx, slot_mapping=self._slots(model, ctx.slot_mapping, pruned_idx)):
            for i in self.skip:
                layer = model.layers[i]
                k, v = project_pruned_kv(layer.self_attn, layer.input_layernorm(x_pruned),
                                         pos_pruned, (maps or {}).get(i))  # (P, kv) each
                write_kv(layer.self_attn.attn, k, v)
        # Pruned tokens leave the block unchanged: hidden 0, residual x_f.
        hidden, residual = torch.zeros_like(x), x  # (T, D) each
        if full_idx.numel():  # none in a chunk from the middle of prompts
            # the block's layers on the full tokens, under their own metadata and slots
            with swapped(ctx, attn_metadata=tokens.full_metadata(),
                         slot_mapping=self._slots(model, ctx.slot_mapping, full_idx)):
                h_full, r_full = self.block(positions.index_select(0, full_idx),
                                            hidden_in.index_select(0, full_idx),
                                            residual_in.index_select(0, full_idx))  # (F, D) each
            hidden.index_copy_(0, full_idx, h_full)
            residual.index_copy_(0, full_idx, r_full)
        if self.top is not None:
            hidden, residual = self.top(positions, hidden, residual)
        out, _ = model.norm(hidden, residual)
        return out  # (T, D)

    def _slots(self, model, slot_mapping: dict, idx) -> dict:
        """The step's slot mapping with the block's layers cut to the tokens `idx` (the K/V
        writes inside the block go to those tokens' slots only)."""
        out = dict(slot_mapping)
        for i in self.skip:
            name = model.layers[i].self_attn.attn.layer_name
            out[name] = slot_mapping[name].index_select(0, idx)
        return out
