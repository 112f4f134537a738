"""The one module that knows Hugging Face internals.

Everything else in POP Lab drives a decoder through a `DecoderAdapter`: embed tokens, compute
rotary embeddings, build each layer's attention mask, run one layer in full, or project one
layer's K/V alone (POP's independent KV projection). transformers renames keywords between minor
releases, so the names live here only.

Two families share the pre-norm layout. "llama" (Llama, Mistral, Qwen2, Qwen3): attention and FFN
outputs are added to the residual directly. "gemma" (Gemma-2, Gemma-3 text): embeddings are scaled
by sqrt(D) inside the embedding module, each branch output is normed before the residual add
(the layer's own forward does that), some layers attend over a sliding window, Gemma-3 uses a
separate rotary embedding for local (sliding) and global layers, Gemma-2 soft-caps its logits.
Layers may sit on different devices (accelerate's device_map): inputs move to each layer's device.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from pop_analysis.engine.adapter_cache import fork

# Keyword names of the pinned transformers range (see requirements.txt).
CACHE_KWARG = "past_key_values"
POS_EMB_KWARG = "position_embeddings"

# model_type -> family. Families share a layer layout; k_norm and sliding windows are per model.
SUPPORTED_FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gemma3": "gemma",  # Gemma-3 image-text checkpoints: text prompts through their language model
}

# Attention kernels whose mask convention the adapter builds (sdpa: bool, eager: additive float).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


class UnsupportedArchitecture(ValueError):
    """The model's architecture has no adapter."""


def check_supported(config) -> None:
    """Raise a readable error for a config whose architecture POP Lab cannot drive."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_FAMILIES:
        arch = ", ".join(getattr(config, "architectures", None) or [str(model_type)])
        raise UnsupportedArchitecture(
            f"unsupported architecture {arch} (model_type {model_type!r}); "
            f"supported: {', '.join(sorted(SUPPORTED_FAMILIES))}"
        )


def check_attention(config) -> str:
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in ATTN_IMPLEMENTATIONS:
        raise UnsupportedArchitecture(
            f"attention implementation {impl!r} is not supported; load the model with "
            f"attn_implementation one of {', '.join(ATTN_IMPLEMENTATIONS)}")
    return impl


@dataclass(frozen=True)
class KVMaps:
    """Fitted K/V projections of the skipped layers for one skip set (the pop_repair variant)."""

    tag: str  # where they come from (a repair's store key)
    maps: dict  # layer -> (k, v) torch.nn.Linear, on that layer's device and in the model's dtype


@dataclass(frozen=True)
class Shape:
    """Sizes a FLOP count or a UI needs."""

    n_layers: int  # decoder layers
    hidden: int  # D, residual width
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # Dh
    intermediate: int  # FFN width
    vocab: int  # lm_head rows
    max_positions: int  # context window
    windows: tuple = ()  # per layer: sliding window W (keys a query attends) or None; () = none
    qk_norm: bool = False  # q and k normed per head (Qwen3, Gemma-3)
    branch_norms: bool = False  # attention and FFN outputs normed before the residual (Gemma)


class DecoderAdapter:
    """Drives a pre-norm decoder (Llama or Gemma layout) layer by layer."""

    def __init__(self, model):
        check_supported(model.config)
        self.model = model
        self.config = model.config
        self.text_config = model.config.get_text_config(decoder=True)  # = config for text LMs
        self.family = SUPPORTED_FAMILIES[self.config.model_type]
        self.attn_impl = check_attention(self.text_config)
        # The decoder without lm_head (an image-text model's language model).
        self.base = getattr(model.model, "language_model", model.model)
        self.layers = list(self.base.layers)
        if not self.layers:
            raise ValueError("the model has no decoder layers")
        if any(getattr(getattr(m, "_hf_hook", None), "offload", False) for m in self.layers):
            raise ValueError("layers offloaded to cpu/disk by a device_map are not supported: "
                             "POP calls a skipped layer's norm and K/V projections directly")
        self.has_k_norm = hasattr(self.layers[0].self_attn, "k_norm")
        # Sliding windows as the cache sees them: a sliding layer's cache keeps the last W-1 keys.
        self.windows = [getattr(c, "sliding_window", None) for c in self.new_cache().layers]
        self._rope_keys = self._rope_layer_keys()
        self.logit_softcap = getattr(self.text_config, "final_logit_softcapping", None)
        self.shape = self._shape()
        # skip set (sorted tuple) -> KVMaps; pop_repair reads them (register_kv_maps).
        self.kv_maps: dict[tuple[int, ...], KVMaps] = {}

    def _rope_layer_keys(self) -> list[str | None]:
        """Per layer, the rotary embedding it uses: None = one shared, else its layer type."""
        per_type = "layer_type" in inspect.signature(self.base.rotary_emb.forward).parameters
        types = getattr(self.text_config, "layer_types", None)
        if not per_type or not types:
            return [None] * len(self.layers)
        return list(types)

    def _shape(self) -> Shape:
        c = self.text_config
        attn = self.layers[0].self_attn
        return Shape(
            n_layers=len(self.layers),
            hidden=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim=attn.head_dim,
            intermediate=c.intermediate_size,
            vocab=c.vocab_size,
            max_positions=getattr(c, "max_position_embeddings", 0) or 0,
            windows=tuple(self.windows) if any(w is not None for w in self.windows) else (),
            qk_norm=self.has_k_norm,
            branch_norms=self.family == "gemma",
        )

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        """Where token ids go in (the embedding's device)."""
        return self.base.embed_tokens.weight.device

    def layer_device(self, i: int) -> torch.device:
        return self.layers[i].input_layernorm.weight.device

    # --- modules other code may hook (drift, gates, call counters) ---
    def attention(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn

    def ffn(self, i: int) -> torch.nn.Module:
        return self.layers[i].mlp

    def o_proj(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn.o_proj

    def k_proj(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn.k_proj

    def v_proj(self, i: int) -> torch.nn.Module:
        return self.layers[i].self_attn.v_proj

    def kv_map_modules(self, i: int) -> list[torch.nn.Module]:
        """Fitted K projections registered for layer i (call counters count them as k_proj)."""
        return [e.maps[i][0] for e in self.kv_maps.values() if i in e.maps]

    def rotary_module(self) -> torch.nn.Module:
        """The rotary embedding: called with each chunk's position ids (hooks learn what runs)."""
        return self.base.rotary_emb

    def input_norm(self, i: int) -> torch.nn.Module:
        return self.layers[i].input_layernorm

    def residual_branches(self, i: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The modules whose outputs are added to the residual stream: (attention, FFN).

        Llama family: self_attn (returns a tuple, output first) and mlp. Gemma: the post-attention
        and post-feed-forward norms; scaling the raw attention/FFN output there would be undone
        by those RMSNorms, so a gate must act on the normed branch.
        """
        layer = self.layers[i]
        if self.family == "gemma":
            return layer.post_attention_layernorm, layer.post_feedforward_layernorm
        return layer.self_attn, layer.mlp

    # --- the forward pieces ---
    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def fork_cache(self, cache: DynamicCache, capacity: int) -> DynamicCache:
        """A detached copy of `cache` for decode steps without autograd (adapter_cache.fork)."""
        return fork(self, cache, capacity)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> input of layer 0 (Gemma's sqrt(D) scale is inside its embedding)."""
        return self.base.embed_tokens(ids.to(self.device))  # (B, T, D)

    def positions(self, start: int, length: int, batch: int = 1,
                  pad: torch.Tensor | None = None) -> torch.Tensor:
        """Position ids of a chunk; with a padding mask (B, S) they count real tokens only."""
        if pad is None:
            pos = torch.arange(start, start + length, device=self.device)  # (T,)
            return pos.unsqueeze(0).expand(batch, -1)  # (B, T)
        real = pad.to(self.device).long()  # (B, S)
        pos = (real.cumsum(-1) - 1).masked_fill(real == 0, 1)  # (B, S), as HF generate does
        return pos[:, start:start + length]  # (B, T)

    def rotary(self, h: torch.Tensor, pos: torch.Tensor):
        """cos, sin (B, T, Dh); a dict of them by layer type where layers use different ropes.

        h only lends its dtype (the rotary module reads no values), so a layer on another
        device, even `meta`, costs no copy.
        """
        h = torch.empty((1, 1, 1), dtype=h.dtype, device=self.device)  # dtype probe
        pos = pos.to(self.device)
        if self._rope_keys[0] is None:
            return self.base.rotary_emb(h, position_ids=pos)  # cos, sin: (B, T, Dh)
        return {t: self.base.rotary_emb(h, pos, t) for t in set(self._rope_keys)}

    def _rope(self, i: int, rope, device):
        cos, sin = rope if self._rope_keys[i] is None else rope[self._rope_keys[i]]
        return cos.to(device), sin.to(device)  # (B, T, Dh) each

    def layer_mask(self, i: int, cache, n_new: int, pad: torch.Tensor | None = None):
        """Layer i's mask for n_new queries after what its cache holds; None where the kernel's own
        causal mask is exact. Boolean (B|1, 1, T, S+T), True = attend.

        Cache entries are always the most recent positions (a sliding cache keeps the last W-1),
        so key j sits at offset j - n_past from the chunk start, and `pad` (B, positions so far,
        1 = real token) is read from its last S+T columns.
        """
        n_past = self.cache_length(cache, i)
        window = self.windows[i]
        plain = self.attn_impl == "sdpa" and n_past == 0 and (window is None or n_new <= window)
        if pad is None and (n_new == 1 or plain):
            return None
        dev = self.layer_device(i)
        q = torch.arange(n_new, device=dev).unsqueeze(1)  # (T, 1)
        k = torch.arange(n_past + n_new, device=dev).unsqueeze(0) - n_past  # (1, S+T)
        allow = k <= q  # (T, S+T)
        if window is not None:
            allow = allow & (k > q - window)  # HF's sliding rule: distance < W
        allow = allow[None, None]  # (1, 1, T, S+T)
        if pad is not None:
            real = pad[:, -(n_past + n_new):].to(dev).bool()  # (B, S+T)
            # A pad query keeps its own key, so no row is empty (an empty row would give NaN).
            allow = (allow & real[:, None, None, :]) | (k == q)[None, None]  # (B, 1, T, S+T)
        return allow

    def _kernel_mask(self, mask, dtype):
        if mask is None or self.attn_impl != "eager" or mask.dtype != torch.bool:
            return mask
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        return zero.masked_fill(~mask, torch.finfo(dtype).min)  # additive, as eager expects

    def run_layer(self, i, h, pos, rope, cache, mask=None, twin=None) -> torch.Tensor:
        """Layer i in full (attention + FFN), or `twin` in its place (an int8 copy: int8.py);
        writes its K/V into `cache`. Returns (B, T, D) on layer i's device."""
        dev = self.layer_device(i)
        h = h.to(dev)  # (B, T, D)
        mask = self._kernel_mask(None if mask is None else mask.to(dev), h.dtype)
        kwargs = {CACHE_KWARG: cache, POS_EMB_KWARG: self._rope(i, rope, dev)}
        layer = self.layers[i] if twin is None else twin
        return layer(h, attention_mask=mask, position_ids=pos.to(dev), use_cache=True, **kwargs)

    def project_kv(self, i: int, h: torch.Tensor, rope,
                   maps: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """POP's independent KV projection of layer i: input norm -> k/v proj -> k_norm -> RoPE
        (the rope of layer i's type: local or global on Gemma-3). `maps` (k, v) replaces the
        layer's k_proj/v_proj with fitted projections of the same shape (pop_repair).

        Returns post-RoPE keys and values shaped as cached, (B, Hkv, T, Dh) each.
        """
        layer = self.layers[i]
        attn = layer.self_attn
        k_proj, v_proj = maps if maps is not None else (attn.k_proj, attn.v_proj)
        dev = self.layer_device(i)
        x = layer.input_layernorm(h.to(dev))  # (B, T, D)
        heads = (*x.shape[:-1], -1, attn.head_dim)  # (B, T, Hkv, Dh)
        k = k_proj(x).view(heads)  # (B, T, Hkv, Dh)
        if self.has_k_norm:
            k = attn.k_norm(k)
        k = k.transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v_proj(x).view(heads).transpose(1, 2)  # (B, Hkv, T, Dh)
        cos, sin = self._rope(i, rope, dev)  # (B, T, Dh)
        k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)  # (B, Hkv, T, Dh)
        return k, v

    def register_kv_maps(self, skip, maps: dict, tag: str) -> KVMaps:
        """Use fitted projections for pop_repair with this skip set (replacing earlier ones).

        maps: layer -> (k weight, k bias, v weight, v bias), weights shaped as the layer's own
        k_proj / v_proj weights (out, D), biases (out,). Every layer of `skip` needs one.
        """
        key = tuple(sorted(int(i) for i in skip))
        if sorted(maps) != list(key):
            raise ValueError(f"fitted maps cover layers {sorted(maps)}, the skip set {list(key)}")
        built = {i: (self._linear(i, self.k_proj(i), *maps[i][:2]),
                     self._linear(i, self.v_proj(i), *maps[i][2:])) for i in key}
        self.kv_maps[key] = KVMaps(tag, built)
        return self.kv_maps[key]

    def _linear(self, i: int, like: torch.nn.Module, weight, bias) -> torch.nn.Linear:
        """A Linear shaped as `like`, holding the given weight and bias, where layer i lives."""
        want = {"weight": tuple(like.weight.shape), "bias": tuple(like.weight.shape)[:1]}
        for part, got in (("weight", tuple(weight.shape)), ("bias", tuple(bias.shape))):
            if got != want[part]:  # both shapes named: (out, D) for a weight, (out,) for a bias
                raise ValueError(f"layer {i}: the fitted map's {part} is {got}, the "
                                 f"projection's {want[part]}")
        lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True,
                              device=like.weight.device, dtype=like.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(weight), lin.bias.copy_(bias)
        return lin.eval().requires_grad_(False)

    def write_kv(self, cache: DynamicCache, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append to layer i's cache the way the layer does (a sliding layer keeps its window)."""
        cache.update(k, v, i)

    def cached_kv(self, cache: DynamicCache, i: int):
        """Layer i's cached (keys, values), (B, Hkv, S, Dh); None when nothing was written."""
        if i >= len(cache.layers):
            return None
        layer = cache.layers[i]
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            return None
        return layer.keys, layer.values

    def cache_length(self, cache: DynamicCache, i: int) -> int:
        """Entries layer i's cache holds (a sliding layer holds at most W-1)."""
        kv = self.cached_kv(cache, i)
        return 0 if kv is None else kv[0].shape[-2]

    def seen_length(self, cache: DynamicCache, i: int) -> int:
        """Positions ever written to layer i's cache (counts what a sliding window dropped)."""
        if i >= len(cache.layers) or self.cached_kv(cache, i) is None:
            return 0
        return int(cache.layers[i].get_seq_length())

    def forward_padded(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor | None = None,
                       cache=None) -> torch.Tensor:
        """HF's own decoder forward over a padded batch; final norm applied. Returns (B, T, D).

        mask (B, S): 1 for real tokens over cached + new positions; pos (B, T): explicit positions
        (needed with left padding); a cache is appended to when given. Hooks on attention(i) and
        ffn(i) see every layer (gates, recorders).
        """
        kwargs = {CACHE_KWARG: cache} if cache is not None else {}
        out = self.base(input_ids=ids, attention_mask=mask, position_ids=pos,
                        use_cache=cache is not None, **kwargs)
        return out.last_hidden_state  # (B, T, D)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """lm_head (and Gemma-2's soft-cap) on hidden states past the final norm: (.., V)."""
        out = self.model.lm_head(h.to(self.model.lm_head.weight.device))  # (.., V)
        if self.logit_softcap:
            out = torch.tanh(out / self.logit_softcap) * self.logit_softcap
        return out

    def logit_grad(self, logits: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """dL/d(lm_head output) from dL/dlogits, for logits = head(h): through Gemma-2's soft-cap
        (c * tanh(z / c) has slope 1 - (logits / c)^2); unchanged elsewhere. (.., V)."""
        if self.logit_softcap:
            return grad * (1.0 - (logits.to(grad.dtype) / self.logit_softcap) ** 2)
        return grad

    def head_vjp(self, grad: torch.Tensor) -> torch.Tensor:
        """dL/dh from dL/d(lm_head output): (M, V) -> (M, D), as autograd would give it, without
        running lm_head forward again."""
        w = self.model.lm_head.weight  # (V, D)
        return grad.to(w.device, w.dtype) @ w  # (M, D)

    @staticmethod
    def layer_io(args, kwargs, out) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, output) hidden states of a decoder layer, from a forward hook with kwargs."""
        x = args[0] if args else kwargs["hidden_states"]
        y = out[0] if isinstance(out, tuple) else out
        return x, y  # (B, T, D) each

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head on the given positions: (B, T, D) -> (B, T, V)."""
        h = self.base.norm(h_last.to(self.base.norm.weight.device))  # (B, T, D)
        return self.head(h)  # (B, T, V)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

