"""Which int8 kernels help on this CPU, at the embedded models' FFN shapes (precision_bench.py
kernels): fp32 nn.Linear against torchao's int8 dynamic-activation / int8-weight config (eager;
optional: `pip install torchao==0.18.0`, not a dependency of POP Lab) and torch's own dynamic
quantization (x86/fbgemm kernels, one activation scale per call) and engine/int8.py's Int8Linear
(per-token activations on torch._int_mm, what POP Lab uses), through the timing protocol.
"""
from __future__ import annotations

import copy
import warnings

import torch

from pop_analysis.engine.int8 import Int8Linear
from pop_analysis.speed.timing import TimingConfig, measure

# (model, projection, in, out): the FFN's up and down projections of both embedded models
SHAPES = [("smollm2-135m", "up", 576, 1536), ("smollm2-135m", "down", 1536, 576),
          ("gemma3-270m", "up", 640, 2048), ("gemma3-270m", "down", 2048, 640)]


def kernels(lin: torch.nn.Linear) -> dict:
    """{name: int8 module} for the kernels available here."""
    out = {"Int8Linear (per token, torch._int_mm)": Int8Linear(lin)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qc = torch.ao.quantization.per_channel_dynamic_qconfig
        out["torch dynamic (x86)"] = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(copy.deepcopy(lin)), {torch.nn.Linear: qc}, dtype=torch.qint8)
        try:
            from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
        except ImportError:
            return out
        ao = torch.nn.Sequential(copy.deepcopy(lin))
        quantize_(ao, Int8DynamicActivationInt8WeightConfig())
        out["torchao int8 dyn/int8 weight (eager)"] = ao
    return out


@torch.inference_mode()
def probe(lengths, cfg: TimingConfig = TimingConfig(budget_s=1.0)) -> dict:
    rows = []
    for model, proj, d_in, d_out in SHAPES:
        torch.manual_seed(0)
        lin = torch.nn.Linear(d_in, d_out, bias=False).eval()
        for name, q in kernels(lin).items():  # error on Gaussian inputs (no outlier tokens)
            for n in lengths:
                x = torch.randn(1, n, d_in)
                t = measure(lambda: lin(x), lambda: q(x), cfg)
                err = float(((q(x) - lin(x)).norm() / lin(x).norm()))
                rows.append({"model": model, "proj": proj, "kernel": name, "tokens": n,
                             "speedup": t.speedup, "iqr": [t.low, t.high],
                             "fp32_ms": t.full_median_ms, "int8_ms": t.variant_median_ms,
                             "rel_error": err, "trustworthy": t.trustworthy, "note": t.note})
                print(f"{model} {proj} {name} {n}: {t.speedup:.2f}x err {err:.4f} {t.note or ''}",
                      flush=True)
    try:
        import torchao
        version = torchao.__version__
    except ImportError:
        version = None
    return {"rows": rows, "torch": torch.__version__, "torchao": version,
            "engine": torch.backends.quantized.engine}
