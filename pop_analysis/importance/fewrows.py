"""nn.Linear on a few dozen rows, as in the batched decode steps of calibration sampling (CPU).

nn.Linear computes x @ W^T. With 8 to 56 rows, MKL's fp32 GEMM on that transposed weight streams
the weights at about half the rate it reaches for the same product written as (W @ x^T)^T
(2 cores: all of a 30-layer SmolLM2 decode step's linears, 16 rows, 108 ms vs 54 ms; at 64 rows the
plain form wins again). Inside `few_rows(model)`, each nn.Linear of the model computes that way
when its input has ROWS rows and is fp32 on the CPU, and as usual otherwise. Each output element
is the same dot product, so results agree to float rounding (measured bit-identical here).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

ROWS = range(8, 57)  # row counts that take the W @ x^T form (measured; see the module doc)


def _linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    w = module.weight
    if rows not in ROWS or x.device.type != "cpu" or x.dtype != torch.float32 \
            or w.dtype != torch.float32:
        return torch.nn.functional.linear(x, w, module.bias)
    out = torch.mm(w, x.reshape(rows, x.shape[-1]).t()).t()  # (rows, out)
    if module.bias is not None:
        out = out + module.bias
    return out.contiguous().view(*x.shape[:-1], w.shape[0])  # (..., out)


@contextmanager
def few_rows(model: torch.nn.Module):
    """Within the block, the model's nn.Linear layers use the few-row form where it is faster.

    Layers whose forward is already wrapped (accelerate's device hooks) are left alone.
    """
    patched = []
    try:
        for m in model.modules():
            if type(m) is torch.nn.Linear and "forward" not in vars(m):
                m.forward = lambda x, m=m: _linear(m, x)
                patched.append(m)
        yield
    finally:
        for m in patched:
            del m.forward
