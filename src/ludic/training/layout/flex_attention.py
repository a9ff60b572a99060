"""Attention over packed rows on CUDA through FlexAttention: a block mask, the kernel skips what it masks.

The CPU runs packed rows by blocks with bucketed SDPA calls (``segment_attention.py``); on CUDA the
library kernel does it: ``torch.nn.attention.flex_attention`` takes a ``BlockMask`` (which 128 x 128
tiles of a row are empty, full or partial) and computes only the tiles that hold attended pairs, in
one fused kernel per layer, forward and backward. The semantics are those of the CPU path and of the
dense mask ``packing.pack_plan`` builds (tests compare the three)::

    query i attends key j of its row  iff  j == i                           (row padding: itself only)
                                      or   same document and j <= i         (causal in its own run)
                                      or   j in the shared prompt of i's tail

The documents are read off the packed ``position_ids`` alone (``packed_documents``): a run of
positions counting up by one is a document; a run starting at position p > 0 is a tail of a shared
prompt, whose keys are the first p positions of the latest run in that row starting at 0 (its
prompt: the first tail continues the prompt's numbering and joins its run, which changes nothing,
as the prompt's queries are causal either way).

``block_attention(model)`` picks the kernel by device (``block_kernel``): FlexAttention on CUDA
when this torch has it, the bucketed SDPA elsewhere; on CUDA without FlexAttention packed rows keep
the dense mask (``micro_batch_plan.plan_micro_batches`` asks ``has_block_kernel``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ludic.kernels import CpuKernels, select
from ludic.kernels.cpu.segment_attention import (
    BLOCKS_KWARG,
    segment_attention,
    switched_attention,
    unusable_mask,
)
from ludic.training.layout.packing import PackedBatch

FLEX_ATTENTION = "ludic_flex"
"""The transformers attention implementation name this module registers."""
FLEX_MASK_KWARG = "ludic_flex_block_mask"
"""The model keyword carrying the ``BlockMask`` to every attention layer."""
FLEX = "flex"
SEGMENTS = "segments"


def flex_available() -> bool:
    """This torch has FlexAttention (``torch.nn.attention.flex_attention``, torch >= 2.5)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def block_kernel(device: torch.device | str, segments: bool = True) -> str | None:
    """The kernel packed rows run by blocks on ``device``: ``"flex"`` on CUDA (None when this torch lacks
    FlexAttention: the rows keep the dense mask), ``"segments"`` (bucketed SDPA, a CPU kernel) elsewhere
    unless ``segments`` is False (the CPU-kernel switch said no: the dense mask)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return FLEX if flex_available() else None
    return SEGMENTS if segments else None


def model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def has_block_kernel(model: nn.Module, cpu_kernels: CpuKernels | None = None) -> bool:
    """True when ``model``'s device has a kernel for packed rows by blocks (``block_kernel``) that the
    CPU-kernel switch allows (``ludic.kernels.select``; None: ``$LUDIC_CPU_KERNELS``)."""
    device = model_device(model)
    return block_kernel(device, select(device, cpu_kernels).segment_attention) is not None


@dataclass(frozen=True)
class PackedDocuments:
    """Per packed position ``[R, L]``: its document's id, and the row-local columns
    ``[prefix_start, prefix_start + prefix_len)`` of its shared prompt (length 0: none)."""

    document: Tensor
    prefix_start: Tensor
    prefix_len: Tensor


def packed_documents(position_ids: Tensor) -> PackedDocuments:
    """The documents of packed rows whose positions restart per sequence (``pack_plan``'s layout)."""
    pos = position_ids.long()  # [R, L]
    R, L = pos.shape
    cols = torch.arange(L, device=pos.device).expand(R, L)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1  # a run counting up by one is one document
    document = torch.cumsum(starts.reshape(-1).long(), 0).view(R, L)  # ids unique across rows
    run_start = torch.where(starts, cols, torch.zeros_like(cols)).cummax(dim=1).values  # [R, L]
    run_first_pos = pos.gather(1, run_start)  # the position its run starts at
    zero_start = torch.where(starts & (pos == 0), cols, torch.zeros_like(cols)).cummax(dim=1).values
    is_tail = run_first_pos > 0
    prefix_len = torch.where(is_tail, run_first_pos, torch.zeros_like(pos))
    prefix_start = torch.where(is_tail, zero_start, cols)
    return PackedDocuments(document, prefix_start, prefix_len)


def document_mask_mod(docs: PackedDocuments) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """FlexAttention's ``mask_mod(b, h, q, kv)`` for ``docs`` (the rule in the module docstring)."""

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        causal = (docs.document[b, q] == docs.document[b, kv]) & (kv <= q)
        start = docs.prefix_start[b, q]
        prefix = (kv >= start) & (kv < start + docs.prefix_len[b, q])
        return causal | prefix | (q == kv)

    return mask_mod


def packed_block_mask(position_ids: Tensor) -> Any:
    """The ``BlockMask`` [R, 1, L, L] of packed rows (on ``position_ids``' device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    R, L = position_ids.shape
    mask_mod = document_mask_mod(packed_documents(position_ids))
    return create_block_mask(mask_mod, R, None, L, L, device=position_ids.device)


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    """FlexAttention compiled once per process: uncompiled it runs an unfused reference loop."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_attention_forward(
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
    block_mask = kwargs.get(FLEX_MASK_KWARG)
    if block_mask is None:
        raise ValueError(
            f"attention '{FLEX_ATTENTION}' needs the packed rows' BlockMask as the keyword {FLEX_MASK_KWARG}; "
            "call the model through ludic.training.layout.forward"
        )
    if dropout:
        raise ValueError(f"attention '{FLEX_ATTENTION}' has no dropout; got dropout={dropout}")
    if query.is_cuda:
        flex = _compiled_flex()
    else:  # the CPU runs the forward only, uncompiled (tests of the mask logic)
        from torch.nn.attention.flex_attention import flex_attention as flex
    out = flex(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``FLEX_ATTENTION`` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(FLEX_ATTENTION, flex_attention_forward)


def flex_attention(model: nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, ``model`` (on SDPA) runs ``FLEX_ATTENTION``; a no-op otherwise or when nested."""
    return switched_attention(model, FLEX_ATTENTION, register, enabled)


def block_attention(
    model: nn.Module, enabled: bool = True, device: torch.device | str | None = None
) -> contextlib.AbstractContextManager[None]:
    """``model`` switched to its device's block kernel (``block_kernel``) for a block of code.
    ``device``: the device to choose for (default: the model's)."""
    kernel = block_kernel(model_device(model) if device is None else device)
    if kernel == FLEX:
        return flex_attention(model, enabled)
    return segment_attention(model, enabled=enabled and kernel == SEGMENTS)


def block_inputs(packed: PackedBatch, device: torch.device | str | None = None) -> dict[str, Any]:
    """The model keywords for ``packed`` rows packed for block attention, for ``device``'s kernel:
    the blocks (bucketed SDPA) or the ``BlockMask`` (FlexAttention), and an attention mask that any
    other attention refuses (``unusable_mask``)."""
    if packed.blocks is None:
        raise ValueError("block_inputs needs rows packed for block attention (pack_plan(dense_mask=False))")
    kernel = block_kernel(packed.input_ids.device if device is None else device)
    inputs: dict[str, Any] = {"attention_mask": unusable_mask(packed.blocks)}
    if kernel == FLEX:
        inputs[FLEX_MASK_KWARG] = packed_block_mask(packed.position_ids)
    else:
        inputs[BLOCKS_KWARG] = packed.blocks
    return inputs
