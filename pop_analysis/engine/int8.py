"""Int8 copies of decoder layers for the prompt: int8 weights (one scale per output channel) and
int8 activations quantised per token at every call (dynamic), the products exact in int32.

A copy is made per layer on first use (`int8_layers`) and kept beside the model: the original
fp32 layers are never touched, so decode, the full model and every other page run exactly what
they ran before. The copy is a whole decoder layer (norms and attention included) whose Linear
modules are replaced by `Int8Linear`, so it runs through the adapter like the original (same
layer index, same cache writes) and copies no HF forward.

The kernel (bench/kernel_probe.py, docs/precision.md): torchao 0.18's int8 dynamic-activation /
int8-weight config computes exactly this (per-token activations, per-channel weights,
torch._int_mm) but, on this CPU in eager mode, its tensor-subclass dispatch made it 0.5-1.0x
fp32 at 32 tokens and erratic (0.9-3.5x) above; its fast path needs torch.compile per prompt
shape. torch's built-in dynamic quantization (x86/fbgemm) is fast but has one activation scale
per call: SmolLM2's outlier tokens then cost 10-85% relative error in a layer's update (3-10%
per token). So the same scheme as torchao's is called here directly on torch._int_mm.
"""
from __future__ import annotations

import copy
import threading
import weakref
from dataclasses import dataclass

import torch

from pop_analysis.engine.adapter import DecoderAdapter

class Int8Unavailable(ValueError):
    """This model or device has no int8 path; the message says why in one line."""


def unavailable_reason(adapter: DecoderAdapter) -> str | None:
    """Why int8 layers cannot run for this model here (None: they can)."""
    devices = {adapter.layer_device(i).type for i in range(adapter.n_layers)}
    if devices != {"cpu"}:
        return (f"int8 prefill runs on the CPU only (where its int8 kernels were measured); this model is "
                f"on {', '.join(sorted(devices))}")
    dtype = adapter.layers[0].input_layernorm.weight.dtype
    if dtype != torch.float32:
        return f"int8 prefill quantises float32 weights; this model is {str(dtype)[6:]}"
    if not hasattr(torch, "_int_mm"):
        return "int8 prefill needs torch._int_mm (int8 matrix products), missing in this torch"
    return None


@dataclass
class Int8Copies:
    """The int8 layer copies of one model, built on first use."""

    layers: dict  # layer index -> int8 copy of that decoder layer
    lock: threading.Lock  # one build at a time (pages may ask from several threads)


_COPIES: "weakref.WeakKeyDictionary[DecoderAdapter, Int8Copies]" = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def int8_layers(adapter: DecoderAdapter, layers) -> dict:
    """{i: int8 copy of decoder layer i} for `layers`, building missing copies (refused in one
    line where unavailable_reason says so)."""
    wanted = sorted({int(i) for i in layers})
    if not wanted:
        return {}
    reason = unavailable_reason(adapter)
    if reason:
        raise Int8Unavailable(reason)
    with _GUARD:
        copies = _COPIES.setdefault(adapter, Int8Copies({}, threading.Lock()))
    with copies.lock:
        for i in wanted:
            if i not in copies.layers:
                copies.layers[i] = quantize_layer(adapter.layers[i])
        return {i: copies.layers[i] for i in wanted}


def built(adapter: DecoderAdapter) -> dict:
    """The int8 copies built so far for this model ({} when none)."""
    copies = _COPIES.get(adapter)
    return dict(copies.layers) if copies else {}


def quantize_layer(layer: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `layer` with every Linear replaced by an Int8Linear."""
    twin = copy.deepcopy(layer).eval()
    for m in twin.modules():  # a copy made under hooks (counters, recorders) must not inherit them
        for name, value in vars(m).items():
            if name.startswith("_") and "hooks" in name and isinstance(value, dict):
                value.clear()
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, Int8Linear(child))
    return twin


class Int8Linear(torch.nn.Module):
    """y = x W^T + b with W in int8 (one scale per output channel) and x quantised to int8 per
    token at every call (one scale per row); the product is exact in int32 (torch._int_mm)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        q, scale = quantize_weight(linear.weight)  # (out, in) int8, (out,)
        self.register_buffer("weight_t", q.t().contiguous())  # (in, out), int8
        self.register_buffer("scale", scale)  # (out,)
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()  # (M, in)
        s = rows.abs().amax(dim=-1, keepdim=True).clamp_min(TINY) / 127  # (M, 1)
        q = (rows / s).round_().clamp_(-127, 127).to(torch.int8)  # (M, in)
        y = torch._int_mm(q, self.weight_t).float().mul_(s).mul_(self.scale)  # (M, out)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)  # (..., out)


TINY = 1e-12  # smallest scale: an all-zero row or channel stays zero


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight (out, in), fp32 scale (out,)): symmetric, one scale per output channel. The
    serving checkpoint (serving/int8_checkpoint.py) stores exactly these."""
    w = weight.detach().float()  # (out, in)
    scale = w.abs().amax(dim=1).clamp_min(TINY) / 127  # (out,)
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def nbytes(layer: torch.nn.Module) -> int:
    """Bytes an int8 copy holds: int8 weights, their scales and biases, and the float tensors it
    keeps (norms)."""
    return sum(t.numel() * t.element_size() for t in layer.state_dict().values())


def memory(adapter: DecoderAdapter) -> dict:
    """What the int8 copies built so far cost beside the fp32 model, in bytes."""
    layers = built(adapter)
    fp32 = sum(p.numel() * p.element_size() for p in adapter.model.parameters())
    extra = sum(nbytes(m) for m in layers.values())
    return {"int8_layers": len(layers), "int8_bytes": extra, "model_bytes": fp32,
            "extra_share": extra / fp32 if fp32 else 0.0}
