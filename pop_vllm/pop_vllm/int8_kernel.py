"""Which int8 kernel vLLM's CPU build gives a compressed-tensors W8A8 layer of an fp32 model.

vLLM 0.32 picks its AMX kernel (`int8_scaled_mm_with_quant`) whenever the CPU has AMX tiles, but
that kernel takes bf16 or fp16 activations only: an fp32 model's first forward fails with
"expect A to be bfloat16 or half". Its oneDNN int8 kernel takes fp32 (dynamic per-token
activations, per-channel weights, the same scheme as POP Lab's Int8Linear), so for an fp32 model
the choice is oneDNN; bf16 and fp16 models keep vLLM's choice.
"""
from __future__ import annotations


def wrap_sgl_check(original):
    def check_cpu_sgl_kernel(n: int, k: int, dtype) -> bool:
        import torch

        if torch.get_default_dtype() == torch.float32:  # the model's dtype while it loads
            return False
        return original(n, k, dtype)

    return check_cpu_sgl_kernel
