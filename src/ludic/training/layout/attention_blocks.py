"""Which keys each packed position attends to, as blocks: attention over packed rows without an L x L mask.

In a packed row every query attends to a short run of its own keys: a lone sequence or a shared
prompt causally to itself, a tail of a shared prompt to the whole prompt and then causally to itself.
A block is one such run of queries with its keys::

    lone / prompt    queries [q, q+n)   keys [q, q+n)              causal
    tail             queries [q, q+n)   keys [p, p+s) + [q, q+n)   the prefix, then causal

Blocks of similar size go into one *bucket*, padded to a common shape, so one attention call per
bucket covers them: a micro-batch of GRPO groups is two calls per layer (prompts, tails), whatever
its rows. Attention then costs sum(n * (s + n)) pairs over blocks, not R * L^2 over rows: at 8 tails of
129 tokens after a 35-token prompt, 6.7x fewer. ``segment_attention.py`` runs the buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

BUCKET_SLACK = 0.75
"""A block joins the open bucket while its query and key lengths are at least this fraction of the
bucket's largest (padding then stays under ~1/3 of a bucket's pairs)."""


@dataclass(frozen=True)
class Block:
    """``n`` queries at flat packed positions ``[query_start, query_start + n)``; a tail's ``prefix`` keys
    at ``[prefix_start, prefix_start + prefix)`` come before its own (``prefix`` 0: causal on its own)."""

    query_start: int
    n: int
    prefix_start: int = 0
    prefix: int = 0


@dataclass
class AttentionBucket:
    """Blocks padded to one shape.

    ``query_index`` [b, Nq] and ``key_index`` [b, Nk]: flat packed positions of each block's query and
    key slots (padding slots repeat a real position and are masked or discarded); ``mask`` [b, 1, Nq, Nk]
    (True: attend) or None for causal blocks without a prefix (``Nk == Nq``, ``is_causal``);
    ``valid_slots``: which of the ``b * Nq`` query slots are real.
    """

    query_index: Tensor
    key_index: Tensor
    mask: Tensor | None
    valid_slots: Tensor


@dataclass
class AttentionBlocks:
    """Every bucket of a micro-batch, and where each packed position's output comes from.

    ``output_index`` [R * L]: each position's row in the buckets' real outputs laid end to end; row
    padding points one past them (a zero row).
    """

    buckets: list[AttentionBucket]
    output_index: Tensor
    rows: int
    row_length: int

    @property
    def pairs(self) -> int:
        """Query-key pairs the buckets compute (padding included)."""
        return sum(int(b.query_index.numel()) * int(b.key_index.shape[1]) for b in self.buckets)

    def to(self, device: torch.device | str) -> AttentionBlocks:
        moved = [
            AttentionBucket(
                b.query_index.to(device),
                b.key_index.to(device),
                None if b.mask is None else b.mask.to(device),
                b.valid_slots.to(device),
            )
            for b in self.buckets
        ]
        return AttentionBlocks(moved, self.output_index.to(device), self.rows, self.row_length)


def block_pairs(n: int, prefix: int = 0) -> int:
    """Query-key pairs of one block before padding (the cost estimate ``packing.plan_cost`` uses)."""
    return n * (prefix + n)


def build_attention_blocks(blocks: list[Block], rows: int, row_length: int) -> AttentionBlocks:
    """Bucket ``blocks`` (which cover every real position of ``rows`` x ``row_length`` exactly once)."""
    if not blocks:
        raise ValueError("build_attention_blocks got no blocks")
    buckets: list[AttentionBucket] = []
    output_index = np.full(rows * row_length, sum(b.n for b in blocks), dtype=np.int64)
    done = 0
    for group in _group([b for b in blocks if b.n > 0]):
        bucket, positions = _bucket(group)
        output_index[positions] = np.arange(done, done + len(positions))
        done += len(positions)
        buckets.append(bucket)
    return AttentionBlocks(buckets, torch.from_numpy(output_index), rows, row_length)


def _group(blocks: list[Block]) -> list[list[Block]]:
    """Causal blocks and prefixed ones apart; each kind longest first, split where sizes drop."""
    groups: list[list[Block]] = []
    for kind in ([b for b in blocks if b.prefix == 0], [b for b in blocks if b.prefix > 0]):
        current: list[Block] | None = None
        for block in sorted(kind, key=lambda b: (-(b.prefix + b.n), -b.n)):
            if current is not None and _fits(current, block):
                current.append(block)
            else:
                current = [block]
                groups.append(current)
    return groups


def _fits(group: list[Block], block: Block) -> bool:
    first = group[0]
    return block.n >= BUCKET_SLACK * max(b.n for b in group) and (
        block.prefix + block.n >= BUCKET_SLACK * (first.prefix + first.n)
    )


def _bucket(group: list[Block]) -> tuple[AttentionBucket, np.ndarray]:
    """(the padded bucket, the flat positions of its real queries in slot order)."""
    starts = np.array([b.query_start for b in group], dtype=np.int64)
    lengths = np.array([b.n for b in group], dtype=np.int64)
    nq = int(lengths.max())
    slot = np.arange(nq)[None, :]  # [1, Nq]
    real = slot < lengths[:, None]  # [b, Nq]
    query_index = np.where(real, starts[:, None] + slot, starts[:, None])
    valid_slots = np.flatnonzero(real.reshape(-1))
    positions = query_index.reshape(-1)[valid_slots]
    if group[0].prefix == 0:
        bucket = AttentionBucket(
            torch.from_numpy(query_index), torch.from_numpy(query_index), None, torch.from_numpy(valid_slots)
        )
        return bucket, positions
    prefix_starts = np.array([b.prefix_start for b in group], dtype=np.int64)
    prefixes = np.array([b.prefix for b in group], dtype=np.int64)
    ns = int(prefixes.max())
    pslot = np.arange(ns)[None, :]
    in_prefix = pslot < prefixes[:, None]  # [b, Ns]
    prefix_index = np.where(in_prefix, prefix_starts[:, None] + pslot, prefix_starts[:, None])
    key_index = np.concatenate([prefix_index, query_index], axis=1)  # [b, Ns + Nq]
    own = np.arange(nq)[None, :] <= np.arange(nq)[:, None]  # [Nq, Nq]: own key j <= query i
    mask = np.concatenate(
        [np.broadcast_to(in_prefix[:, None, :], (len(group), nq, ns)), np.broadcast_to(own, (len(group), nq, nq))],
        axis=2,
    )[:, None]  # [b, 1, Nq, Ns + Nq]
    bucket = AttentionBucket(
        torch.from_numpy(query_index), torch.from_numpy(key_index),
        torch.from_numpy(np.ascontiguousarray(mask)), torch.from_numpy(valid_slots),
    )  # fmt: skip
    return bucket, positions
