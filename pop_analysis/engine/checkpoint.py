"""Reading a few tensors of a saved checkpoint without building the model: the K/V projection
weights of chosen layers, by name in the safetensors files (one file or an index of shards).

A checkpoint names its tensors after the architecture's modules; every supported family keeps
its decoder layers under `...layers.<i>.self_attn.{k,v}_proj.weight`, whatever the prefix
(`model.`, `model.language_model.`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from pop_analysis.errors import InputError

KV_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.([kv])_proj\.weight$")


def kv_weights(directory: str | Path, layers) -> list[torch.Tensor]:
    """[k_0, v_0, k_1, v_1, ...]: the K and V projection weights of `layers`, in that order."""
    from safetensors import safe_open

    files = _tensor_files(Path(directory))
    want = {(int(i), kind): None for i in layers for kind in "kv"}
    for path, names in files.items():
        with safe_open(str(path), "pt") as f:
            for name in names or f.keys():
                m = KV_NAME.search(name)
                key = (int(m.group(1)), m.group(2)) if m else None
                if key in want and want[key] is None:
                    want[key] = f.get_tensor(name)
    missing = [f"layer {i} {kind}_proj" for (i, kind), t in want.items() if t is None]
    if missing:
        raise InputError(f"{directory} holds no {', '.join(missing[:2])} weight")
    return list(want.values())


def _tensor_files(d: Path) -> dict[Path, list[str] | None]:
    """Each safetensors file -> the names to read from it (None: all), from the index if any."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        shards: dict[Path, list[str]] = {}
        for name, file in json.loads(index.read_text()).get("weight_map", {}).items():
            if KV_NAME.search(name):
                shards.setdefault(d / file, []).append(name)
        return shards
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise InputError(f"{d} holds no safetensors weights")
    return dict.fromkeys(files)
