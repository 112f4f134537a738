"""Fitted K/V maps of variant pop_repair: checked against the model, loaded as projections.

A maps file is a safetensors file holding, per skipped layer L, "L.k.weight" (kv, D), "L.k.bias"
(kv,), "L.v.weight" (kv, D) and "L.v.bias" (kv,): linear maps from the layer's input-normed
hidden state to its K and V before k_norm and RoPE (POP Lab stores its fitted repairs so). The
pruned prompt tokens of a skipped layer project their K/V with them instead of k_proj/v_proj;
x_N and decode tokens keep the layer's own weights. Under tensor parallelism each rank keeps the
rows of its own K/V heads (`rank_rows`), as vLLM's QKVParallelLinear shards k_proj / v_proj.
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


def heads(hf_config) -> tuple[int, int]:
    """(K/V heads, head dim) of a Llama-family or Gemma-3 config."""
    n = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n
    return int(getattr(hf_config, "num_key_value_heads", None) or n), int(head_dim)


def model_dims(hf_config) -> tuple[int, int]:
    """(hidden size, K/V width = kv heads x head dim)."""
    kv_heads, head_dim = heads(hf_config)
    return int(hf_config.hidden_size), kv_heads * head_dim


def rank_rows(kv_heads: int, head_dim: int, rank: int, tp: int) -> slice:
    """The K (or V) rows tensor-parallel rank `rank` of `tp` holds: a share of the heads, or one
    head replicated on tp / kv_heads ranks when there are fewer heads than ranks (vLLM's rule)."""
    local = max(1, kv_heads // tp)  # heads per rank
    shard = rank // max(1, tp // kv_heads)
    return slice(shard * local * head_dim, (shard + 1) * local * head_dim)


def check_settings(pop, hf_config) -> None:
    """The maps of pop_repair settings against the model (front end and worker)."""
    if pop.variant == "pop_repair":
        check_maps(pop.repair, pop.skip, *model_dims(hf_config))


def load_projections(pop, dtype, device, hf_config) -> dict:
    """layer -> KVProjection of the fitted maps (this rank's K rows, then its V rows, as its
    qkv_proj's K/V rows); `check_settings` has checked the file's tensors and shapes."""
    import torch
    from safetensors.torch import load_file
    from vllm.distributed import (get_tensor_model_parallel_rank,
                                  get_tensor_model_parallel_world_size)

    from .layer import KVProjection

    rows = rank_rows(*heads(hf_config), get_tensor_model_parallel_rank(),
                     get_tensor_model_parallel_world_size())

    t = load_file(pop.repair)
    bad = [n for n, x in t.items() if not torch.isfinite(x).all()]
    if bad:
        raise PopSettingsError(f"repair maps file {pop.repair:.200} holds non-finite values in "
                               f"{', '.join(bad[:3])}")
    out = {}
    for i in pop.skip:
        w = torch.cat([t[f"{i}.k.weight"][rows], t[f"{i}.v.weight"][rows]])  # (2 kv_rank, D)
        b = torch.cat([t[f"{i}.k.bias"][rows], t[f"{i}.v.bias"][rows]])  # (2 kv_rank,)
        out[i] = KVProjection(w.to(device, dtype).contiguous(), b.to(device, dtype).contiguous())
    return out
