"""The gradient of a tied input embedding added into the weight's ``.grad`` in place, rows touched only.

Why: in a model whose output layer is its input embedding (SmolLM2, Qwen2-0.5B, Llama-3.2-1B:
``tie_word_embeddings``), autograd's embedding backward builds a dense gradient of the whole
vocabulary x hidden matrix (113 MB at SmolLM2-135M) that is zero except in the rows of the batch's
tokens, then adds it to the output layer's gradient of the same weight in a third tensor of that size.
That happens in the last milliseconds of every backward, and it was the main job's memory peak: resident
memory rose ~110 MB in the backward's last ~20 ms and fell again (sampled every 2 ms, 12-step runs), by an
amount that depended on which freed pages the allocator still held.

Here the lookup's backward adds each token's gradient row into ``weight.grad`` directly
(``index_add_``), and the lookup keeps no autograd edge to the weight, so autograd never builds the dense
tensor:

    E = W[ids],   dW += scatter_rows(ids, dE)     (rows at ``padding_idx`` get nothing, as in aten)

The output layer's gradient reaches ``weight.grad`` through autograd as before; the two are summed in
place in either order, so ``.grad`` ends equal to autograd's to fp32 rounding (the sums' order differs;
test). A hook registered on the weight sees only the output layer's part, which is why this runs only
inside ``tied_embedding_grads`` (the Trainer's micro-batch kernels), never under FSDP, whose gradient
reduction starts from that hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_GRAPH_ANCHOR = torch.zeros(0, requires_grad=True)
"""An empty input that requires grad, so the lookup joins the graph without an edge to the weight."""


class RowwiseEmbeddingGrad(torch.autograd.Function):
    """``F.embedding(ids, weight)`` whose backward adds into ``weight.grad`` in place (module docstring)."""

    @staticmethod
    def forward(ctx: Any, ids: Tensor, anchor: Tensor, module: nn.Embedding) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.module = module
        return F.embedding(ids, module.weight.detach(), module.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[None, None, None]:  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        weight = ctx.module.weight
        rows, grads = ids.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1])
        padding_idx = ctx.module.padding_idx
        if padding_idx is not None:
            keep = rows != padding_idx
            rows, grads = rows[keep], grads[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, rows, grads.to(weight.grad.dtype))
        return None, None, None


def tied_input_embedding(model: nn.Module) -> nn.Embedding | None:
    """``model``'s input embedding when the output layer shares its weight, it trains, and its lookup is a
    plain one (no ``max_norm`` renorm, no frequency scaling, no sparse gradient); else None."""
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    if not callable(get_in) or not callable(get_out):
        return None
    embedding, head = get_in(), get_out()
    if type(embedding) is not nn.Embedding or head is None or getattr(head, "weight", None) is not embedding.weight:
        return None
    if not embedding.weight.requires_grad or embedding.max_norm is not None:
        return None
    return None if embedding.scale_grad_by_freq or embedding.sparse else embedding


def _lookup(module: nn.Embedding):
    def forward(ids: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            return F.embedding(ids, module.weight, module.padding_idx)
        return RowwiseEmbeddingGrad.apply(ids, _GRAPH_ANCHOR, module)

    return forward


@contextlib.contextmanager
def tied_embedding_grads(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, a tied input embedding's gradient goes into ``weight.grad`` row by row (module
    docstring); a no-op when ``enabled`` is False or the model has no such embedding."""
    embedding = tied_input_embedding(model) if enabled else None
    if embedding is None:
        yield
        return
    embedding.forward = _lookup(embedding)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del embedding.forward
