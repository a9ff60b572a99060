"""A KV cache whose full-attention layers write into preallocated buffers instead of concatenating.

``transformers``' ``DynamicLayer.update`` runs ``torch.cat([keys, new])`` for every layer at every
decoding step, so a reply of n tokens copies O(n^2) cached positions. Here each layer keeps a
buffer sized for the prompt plus ``max_new_tokens`` and hands the model a view of its filled part:
one write per step, no copy (the buffer only grows, by doubling, if a run outlives its estimate).
Dropping finished rows (``batch_select_indices``) still gathers the rows kept, as before.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by a [B, heads, capacity, head_dim] buffer per keys and values."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = max(1, capacity)
        self._length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        B, H, _, D = key_states.shape
        self._k = key_states.new_empty(B, H, self.capacity, D)
        self._v = value_states.new_empty(B, value_states.shape[1], self.capacity, value_states.shape[-1])
        self._length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, new = self._length, key_states.shape[-2]
        if n + new > self._k.shape[-2]:
            self._grow(n + new)
        self._k[..., n : n + new, :] = key_states
        self._v[..., n : n + new, :] = value_states
        self._length = n + new
        self.keys, self.values = self._k[..., : self._length, :], self._v[..., : self._length, :]
        return self.keys, self.values

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._k.shape[-2])
        k = self._k.new_empty(*self._k.shape[:2], size, self._k.shape[-1])
        v = self._v.new_empty(*self._v.shape[:2], size, self._v.shape[-1])
        k[..., : self._length, :] = self._k[..., : self._length, :]
        v[..., : self._length, :] = self._v[..., : self._length, :]
        self._k, self._v = k, v

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._length > 0:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[..., : self._length, :], self._v[..., : self._length, :]


def preallocated_cache(config: object, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are ``PreallocatedLayer``s.

    Sliding-window and other special layers keep transformers' own implementation.
    """
    cache = DynamicCache(config=config)
    cache.layers = [
        PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
