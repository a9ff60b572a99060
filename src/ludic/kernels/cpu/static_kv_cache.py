"""A decoding KV cache that gives every row its own copy of its prompt's K/V (the lean decoder's plain cache).

One preallocated tensor for every layer, written one column a step; its attention is transformers' own SDPA
call, so with ``LeanDecoder(exact=True)`` the logits equal the model's forward bit for bit. Rows sharing a
prompt can keep it once instead (``shared_prefix_cache.py``); ``lean_decoder`` re-exports this class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class StaticKVCache:
    """K and V of every layer in one preallocated tensor ``[layers, 2, rows, kv_heads, max_len, head_dim]``.

    ``valid[b, t]`` is False at left-padding columns. Rows are compacted in place (finished rows
    dropped) so the live rows are always ``[:rows]``; only the filled columns are ever read or moved.
    """

    kv: torch.Tensor
    valid: torch.Tensor
    rows: int
    padded: bool  # some live row has a padding column (else attention needs no mask)
    column: int = 0  # the column this step writes (set by ``begin``)
    mask: torch.Tensor | None = None  # this step's padding mask (None when no live row is padded)

    @classmethod
    def from_prefill(cls, cache, index: torch.Tensor, mask: torch.Tensor, max_len: int) -> StaticKVCache:
        """Copy a prefill's ``DynamicCache`` (rows fanned out by ``index``) into a cache of ``max_len`` columns."""
        first = cache.layers[0].keys
        _, heads, width, dim = first.shape
        rows = index.shape[0]
        kv = torch.empty((len(cache.layers), 2, rows, heads, max_len, dim), dtype=first.dtype, device=first.device)
        for layer, entry in enumerate(cache.layers):
            kv[layer, 0, :, :, :width] = entry.keys.index_select(0, index)
            kv[layer, 1, :, :, :width] = entry.values.index_select(0, index)
        valid = torch.ones((rows, max_len), dtype=torch.bool, device=first.device)
        valid[:, :width] = mask.bool()
        return cls(kv, valid, rows, padded=not bool(valid[:, :width].all()))

    def drop(self, done: torch.Tensor, filled: int) -> torch.Tensor | None:
        """Drop the live rows where ``done [rows]`` is True; returns each kept row's old batch position
        (None when no row is left). The last kept rows move into the holes, so only as many rows
        are copied as were dropped; only the ``filled`` columns move."""
        keep = (~done).nonzero().squeeze(-1)
        n = keep.shape[0]
        if n == 0:
            return None
        holes = done[:n].nonzero().squeeze(-1)  # dropped rows inside the kept prefix
        movers = keep[keep >= n]  # kept rows beyond it, one per hole
        order = torch.arange(n, device=done.device)
        if holes.numel():
            self.kv[:, :, holes, :, :filled] = self.kv[:, :, movers, :, :filled]
            self.valid[holes, :filled] = self.valid[movers, :filled]
            order[holes] = movers
        self.rows = n
        self.padded = not bool(self.valid[:n, :filled].all())
        return order

    def begin(self, column: int) -> None:
        """This step writes K/V at ``column`` and attends over columns ``[0, column]``."""
        self.column = column
        self.mask = self.valid[: self.rows, None, None, : column + 1] if self.padded else None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention ``[rows, heads * head_dim]`` for ``q [rows, heads, head_dim]`` after writing ``k``/``v``
        ``[rows, kv_heads, head_dim]`` at this step's column (transformers' SDPA call, so the logits
        match bit for bit)."""
        n, heads, d = q.shape
        kv_heads = k.shape[1]
        column = self.column
        self.kv[layer, 0, :n, :, column] = k
        self.kv[layer, 1, :n, :, column] = v
        keys = self.kv[layer, 0, :n, :, : column + 1]
        values = self.kv[layer, 1, :n, :, : column + 1]
        groups = heads // kv_heads
        if groups > 1 and self.mask is None:  # transformers' choice for one query token without a mask
            out = F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=scale, enable_gqa=True)
        else:  # with a mask: query heads packed onto their KV head
            out = F.scaled_dot_product_attention(q.view(n, kv_heads, groups, d), keys, values, attn_mask=self.mask, scale=scale)
        return out.reshape(n, heads * d)
