"""Attention over packed rows by blocks (``training/layout/attention_blocks.py``) instead of a dense L x L mask.

With a 4D mask, SDPA computes every query against every key of its row, then masks: a row of 8
tails of 129 tokens after a 35-token prompt runs 1,067^2 pairs where 169k are attended. Here each
bucket of blocks gathers its queries and keys from the packed positions, runs one SDPA call
(``is_causal`` for lone sequences and prompts, a small boolean mask for tails), and the outputs are
gathered back into packed order; autograd carries the gradients through the gathers (a shared
prompt's keys collect the gradients of every tail that read them). The result equals the dense
mask's to float rounding, and so do the gradients (tests).

A transformers attention function, registered as ``SEGMENT_ATTENTION``. ``segment_attention(model)``
switches a model that runs ``sdpa`` to it for a block of code (forward and backward, so the forward
that activation checkpointing recomputes takes the same path); the model is then called with the
blocks as the keyword ``ludic_attention_blocks``, which transformers passes through to every
attention layer, and no attention mask (none is built: transformers skips mask creation for an
attention function without a mask function).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Bucket(Protocol):
    """One SDPA call's worth of blocks (``training.layout.attention_blocks.AttentionBucket`` is one):
    ``query_index`` [b, Nq] / ``key_index`` [b, Nk] packed positions, ``mask`` [b, 1, Nq, Nk] (None:
    causal), ``valid_slots``: which of the ``b * Nq`` query slots are real."""

    @property
    def query_index(self) -> Tensor: ...
    @property
    def key_index(self) -> Tensor: ...
    @property
    def mask(self) -> Tensor | None: ...
    @property
    def valid_slots(self) -> Tensor: ...


class Blocks(Protocol):
    """What the kernel reads of packed rows' attention blocks (``AttentionBlocks`` in
    ``training/layout/attention_blocks.py`` builds them; passed in, so kernels import no training code)."""

    @property
    def rows(self) -> int: ...
    @property
    def row_length(self) -> int: ...
    @property
    def buckets(self) -> Sequence[Bucket]: ...
    @property
    def output_index(self) -> Tensor: ...


SEGMENT_ATTENTION = "ludic_segments"
BLOCKS_KWARG = "ludic_attention_blocks"
SWITCHABLE = "sdpa"
"""Only models on torch's SDPA are switched (eager models keep the dense-mask path, flash kernels
cannot take packed rows here)."""


def segment_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """``query`` [R, H, L, D], ``key``/``value`` [R, Hkv, L, D] -> output [R, L, H, D] (transformers' layout)."""
    blocks: Blocks | None = kwargs.get(BLOCKS_KWARG)
    if blocks is None:
        raise ValueError(
            f"attention '{SEGMENT_ATTENTION}' needs the packed rows' blocks as the keyword {BLOCKS_KWARG}; "
            "call the model through ludic.training.layout.forward, or outside segment_attention(model)"
        )
    R, H, L, D = query.shape
    if (blocks.rows, blocks.row_length) != (R, L):
        raise ValueError(f"attention blocks are for {blocks.rows} x {blocks.row_length} rows, got {R} x {L}")
    kv_heads = key.shape[1]
    q = query.transpose(1, 2).reshape(R * L, H, D)  # [N, H, D]: packed positions first
    k = key.transpose(1, 2).reshape(R * L, kv_heads, D)
    v = value.transpose(1, 2).reshape(R * L, kv_heads, D)
    outputs = []
    for bucket in blocks.buckets:  # index_select: its backward is an index_add, not a sorting index_put
        b, nq = bucket.query_index.shape
        nk = bucket.key_index.shape[1]
        keys = bucket.key_index.view(-1)
        qb = q.index_select(0, bucket.query_index.view(-1)).view(b, nq, H, D).transpose(1, 2)  # [b, H, Nq, D]
        kb = k.index_select(0, keys).view(b, nk, kv_heads, D).transpose(1, 2)  # [b, Hkv, Nk, D]
        vb = v.index_select(0, keys).view(b, nk, kv_heads, D).transpose(1, 2)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=bucket.mask, dropout_p=dropout, is_causal=bucket.mask is None,
            scale=scaling, enable_gqa=kv_heads != H,
        )  # fmt: skip
        outputs.append(ob.transpose(1, 2).reshape(-1, H, D).index_select(0, bucket.valid_slots))  # real slots
    outputs.append(q.new_zeros(1, H, D))  # what row padding reads
    out = torch.cat(outputs).index_select(0, blocks.output_index)  # [N, H, D] in packed order
    return out.view(R, L, H, D), None


def unusable_mask(blocks: Blocks) -> Tensor:
    """The ``attention_mask`` to pass beside the blocks: an empty [R, 1, 0, 0] mask that transformers
    hands to the attention function as it is and that any other attention (SDPA, eager) refuses on its
    shape. Without it a model not switched to ``SEGMENT_ATTENTION`` (a forward that activation
    checkpointing recomputes outside ``segment_attention``) would build a mask from the restarting
    position ids and silently let tails lose sight of their prompt."""
    return torch.zeros((blocks.rows, 1, 0, 0), device=blocks.output_index.device)


def register() -> None:
    """Make ``SEGMENT_ATTENTION`` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_ATTENTION, segment_attention_forward)


def can_switch(model: nn.Module) -> bool:
    """True when ``model``'s attention can run as ``SEGMENT_ATTENTION`` (it runs on torch's SDPA)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in (SWITCHABLE, SEGMENT_ATTENTION)


@contextlib.contextmanager
def switched_attention(
    model: nn.Module, name: str, register_kernel: Callable[[], None], enabled: bool = True
) -> Iterator[None]:
    """Within the block, ``model`` (on SDPA) runs the attention implementation ``name`` (registered by
    ``register_kernel``); a no-op when disabled, for other kernels, or when nested."""
    config = getattr(model, "config", None)
    if not enabled or config is None or getattr(config, "_attn_implementation", None) != SWITCHABLE:
        yield
        return
    register_kernel()
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = SWITCHABLE


def segment_attention(model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``model`` (on SDPA) runs ``SEGMENT_ATTENTION``; a no-op otherwise or when nested."""
    return switched_attention(model, SEGMENT_ATTENTION, register, enabled)
