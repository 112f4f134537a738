"""Fitted K/V maps of variant pop_repair: checked against the model, loaded as projections.

A maps file is a safetensors file holding, per skipped layer L, "L.k.weight" (kv, D), "L.k.bias"
(kv,), "L.v.weight" (kv, D) and "L.v.bias" (kv,): linear maps from the layer's input-normed
hidden state to its K and V before k_norm and RoPE (POP Lab stores its fitted repairs so). The
pruned prompt tokens of a skipped layer project their K/V with them instead of k_proj/v_proj;
x_N and decode tokens keep the layer's own weights.
"""
from __future__ import annotations

from .settings import PopSettingsError

PARTS = ("k.weight", "k.bias", "v.weight", "v.bias")


def expected_shapes(skip, hidden: int, kv_dim: int) -> dict:
    """Tensor name -> shape a maps file must hold for this skip set and model."""
    shapes = {"k.weight": (kv_dim, hidden), "k.bias": (kv_dim,),
              "v.weight": (kv_dim, hidden), "v.bias": (kv_dim,)}
    return {f"{i}.{part}": shapes[part] for i in skip for part in PARTS}


def check_maps(path: str, skip, hidden: int, kv_dim: int) -> None:
    """One-line PopSettingsError unless the file's tensors cover exactly `skip` with this model's
    shapes, stored as floats (reads the header only)."""
    from safetensors import safe_open

    want = expected_shapes(skip, hidden, kv_dim)
    try:
        with safe_open(path, "pt") as f:
            have = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
            types = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # "F32", "I8"
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one line
        text = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PopSettingsError(f"repair maps file {path:.200} is unreadable ({text[:200]})") from None
    layers = sorted({int(n.split(".")[0]) for n in have if n.split(".")[0].isdigit()})
    if set(have) - set(want) or set(want) - set(have):
        raise PopSettingsError(f"repair maps file {path:.200} holds maps for layers {layers or 'none'}"
                               f" ({len(have)} tensors), not exactly skip set {list(skip)} (4 "
                               "tensors per layer: k/v weight and bias)")
    ints = sorted(n for n, kind in types.items() if not kind.startswith(("F", "BF")))
    if ints:  # the cast to the engine's dtype would make them garbage; half precision is fine
        raise PopSettingsError(f"repair maps file {path:.200}: map {ints[0]} is stored as "
                               f"{types[ints[0]]}, not a float type")
    bad = [f"{n} {list(have[n])} (want {list(s)})" for n, s in want.items() if have[n] != s]
    if bad:
        raise PopSettingsError(f"repair maps file {path:.200} does not fit this model (hidden {hidden}"
                               f", K/V width {kv_dim}): {'; '.join(bad[:3])}")


def model_dims(hf_config) -> tuple[int, int]:
    """(hidden size, K/V width = kv heads x head dim) of a Llama-family config."""
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    return int(hf_config.hidden_size), int(kv_heads * head_dim)


def check_settings(pop, hf_config, tensor_parallel: int) -> None:
    """The maps of pop_repair settings against the model and the engine (front end and worker)."""
    if pop.variant != "pop_repair":
        return
    if tensor_parallel > 1:
        raise PopSettingsError("variant pop_repair supports tensor parallel size 1 only (its K/V "
                               f"maps are not sharded across ranks), got {tensor_parallel}")
    check_maps(pop.repair, pop.skip, *model_dims(hf_config))


def load_projections(pop, dtype, device) -> dict:
    """layer -> KVProjection of the fitted maps (K rows, then V rows, as qkv_proj's K/V rows);
    `check_settings` has checked the file's tensors and shapes."""
    import torch
    from safetensors.torch import load_file

    from .layer import KVProjection

    t = load_file(pop.repair)
    bad = [n for n, x in t.items() if not torch.isfinite(x).all()]
    if bad:
        raise PopSettingsError(f"repair maps file {pop.repair:.200} holds non-finite values in "
                               f"{', '.join(bad[:3])}")
    out = {}
    for i in pop.skip:
        w = torch.cat([t[f"{i}.k.weight"], t[f"{i}.v.weight"]])  # (2 kv, D)
        b = torch.cat([t[f"{i}.k.bias"], t[f"{i}.v.bias"]])  # (2 kv,)
        out[i] = KVProjection(w.to(device, dtype).contiguous(), b.to(device, dtype).contiguous())
    return out
