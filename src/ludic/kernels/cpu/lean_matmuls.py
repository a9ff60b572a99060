"""How the lean decoder's matmuls run on the CPU: the weights packed once per batch, in Ludic's decoding
kernel's layout (``decode_gemm.py``) where it takes them, else oneDNN's blocked layout, and the matmul that
reads each layout (``LeanDecoder.bind`` packs, ``LeanDecoder.step`` multiplies)."""

from __future__ import annotations

import torch

from ludic.kernels.cpu import decode_gemm
from ludic.kernels.private_ops import LINEAR_POINTWISE, REORDER_LINEAR_WEIGHT, works


def can_pack(model: torch.nn.Module) -> bool:
    """oneDNN's packed fp32 matmul can run this model's weights (CPU, fp32, its private ops working)."""
    weight = model.lm_head.weight
    on_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
    return on_cpu and works(LINEAR_POINTWISE) and works(REORDER_LINEAR_WEIGHT)


def pack(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias  # a copy in oneDNN's blocked layout


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with a weight from ``pack`` (oneDNN's inner product, as inductor's CPU fusion calls it)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack_for_gemm(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``decode_gemm``'s layout (3-D) where it takes the weight, else oneDNN's (``pack``, 2-D)."""
    return (decode_gemm.pack(weight), bias) if decode_gemm.packable(weight) else pack(weight, bias, rows)


def packed_concat(weights: list[torch.Tensor]) -> torch.Tensor:
    """The fused weight of ``weights`` straight in ``decode_gemm``'s layout where it takes them all (one copy
    instead of a concatenated one and its packed copy: ~0.1 s of a batch's bind at SmolLM2-135M), else concatenated."""
    return decode_gemm.pack_concat(weights) if all(decode_gemm.packable(w) for w in weights) else torch.cat(weights)


def gemm_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with a weight from ``pack_for_gemm``: Ludic's kernel for its layout, oneDNN for the other."""
    return decode_gemm.linear(x, weight, bias) if weight.dim() == 3 else packed_linear(x, weight, bias)
