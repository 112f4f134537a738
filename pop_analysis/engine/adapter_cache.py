"""The adapter's cache internals (part of adapter.py, split off for size): a detached fork of a
DynamicCache whose full-attention layers write decode steps into a preallocated buffer.

Only adapter.py imports this module; like adapter.py it knows HF's cache layer classes.
"""
from __future__ import annotations

import copy

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def fork(adapter, cache: DynamicCache, capacity: int) -> DynamicCache:
    """A detached copy of `cache` for decode steps without autograd; the original is untouched.

    Full-attention layers write into a buffer of `capacity` positions instead of concatenating
    (a batched decode step would otherwise copy every layer's whole cache every step); sliding
    layers keep HF's own window logic (and their count of positions seen).
    """
    out = adapter.new_cache()
    for i, src in enumerate(cache.layers):
        if adapter.cached_kv(cache, i) is None:
            continue
        keys, values = src.keys.detach(), src.values.detach()
        if type(src) is DynamicLayer:
            dst = PreallocatedLayer(capacity)
            dst.update(keys, values)
        else:
            dst = copy.copy(src)  # update() rebinds keys/values, so the copy is independent
            dst.keys, dst.values = keys, values
        out.layers[i] = dst
    return out


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer that writes new positions into a preallocated buffer.

    keys/values are views of the first positions of the buffer, as DynamicLayer's would be; a
    buffer that fills up is reallocated twice as large. For steps without autograd only.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = max(1, capacity)
        self.length = 0
        self._kbuf = self._vbuf = None

    def update(self, key_states, value_states, *args, **kwargs):
        if torch.is_grad_enabled() and (key_states.requires_grad or value_states.requires_grad):
            raise ValueError("a preallocated cache layer is for steps without autograd")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.length, key_states.shape[-2]
        if self._kbuf is None or n + t > self._kbuf.shape[-2]:
            self._grow(key_states, value_states, max(self.capacity, 2 * (n + t)))
        self._kbuf[:, :, n:n + t] = key_states  # (B, Hkv, t, Dh)
        self._vbuf[:, :, n:n + t] = value_states
        self.length = n + t
        self.keys, self.values = self._kbuf[:, :, :n + t], self._vbuf[:, :, :n + t]
        return self.keys, self.values

    def _grow(self, k, v, size: int) -> None:
        kbuf = k.new_empty(*k.shape[:2], size, k.shape[-1])  # (B, Hkv, size, Dh)
        vbuf = v.new_empty(*v.shape[:2], size, v.shape[-1])
        if self.length:
            kbuf[:, :, :self.length] = self.keys
            vbuf[:, :, :self.length] = self.values
        self._kbuf, self._vbuf = kbuf, vbuf
