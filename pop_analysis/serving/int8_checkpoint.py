"""A compressed-tensors W8A8 int8 copy of a converted model, for a vLLM instance that would run
the prompt in int8 (docs/serving.md, "An int8 prefill pool").

Each decoder Linear of the chosen layers is stored as POP Lab's int8 prompt layers hold it
(`engine/int8.quantize_weight`: int8, one fp32 scale per output channel), with activations
declared dynamic, per token and symmetric: what `Int8Linear` does at every call. Embeddings,
norms, lm_head and the Linears of the other layers stay fp32 (the other layers are named in the
checkpoint's `ignore` list). Tokenizer and generation files are copied as they are.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from pop_analysis.engine.int8 import quantize_weight
from pop_analysis.errors import InputError
from pop_vllm.precision import Precision
from pop_vllm.run_setting import RunSetting

LINEAR = re.compile(r"^model\.layers\.(\d+)\.(.+_proj)\.weight$")  # a decoder layer's Linear
SCHEME = {  # compressed-tensors' names for Int8Linear's scheme
    "targets": ["Linear"],
    "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                          "dynamic": True},
}
MODEL_FILE = "model.safetensors"


def write(src: str | Path, dst: str | Path, layers=None) -> Path:
    """Write the int8 copy of the converted model in `src` (config.json and one
    model.safetensors) to `dst`; `layers`: the decoder layers stored in int8 (None: all)."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file() or not (src / MODEL_FILE).is_file():
        raise InputError(f"{src} holds no converted model (config.json and {MODEL_FILE})")
    if src.resolve() == dst.resolve():
        raise InputError("write the int8 copy to another folder than the model's own")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    n = int(config.get("num_hidden_layers") or 0)
    chosen = range(n) if layers is None else layers
    chosen = set(RunSetting((), "full", precision=Precision(tuple(chosen))).check(n).precision.int8)
    if not chosen:
        raise InputError("an int8 checkpoint needs at least one int8 layer")
    weights, ignore = {}, ["lm_head"]
    for name, tensor in load_file(str(src / MODEL_FILE)).items():
        m = LINEAR.match(name)
        if m and int(m.group(1)) in chosen:
            q, scale = quantize_weight(tensor)
            weights[name] = q.contiguous()
            weights[name[:-len("weight")] + "weight_scale"] = scale[:, None].contiguous()  # (out, 1)
        else:
            weights[name] = tensor.contiguous()
            if m:
                ignore.append(f"model.layers.{m.group(1)}.{m.group(2)}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", MODEL_FILE):
            shutil.copy2(f, dst / f.name)
    save_file(weights, str(dst / MODEL_FILE), metadata={"format": "pt"})
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "config_groups": {"group_0": SCHEME},
        "ignore": sorted(ignore)}
    (dst / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return dst
