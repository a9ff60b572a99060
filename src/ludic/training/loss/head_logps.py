"""Token log-probs straight from the last hidden states, chunk by chunk through the output layer.

``log_softmax(hidden @ W.T + b)[target]`` for N scored positions without ever holding the [N, V]
logits: the forward keeps only the [N] logsumexp, and the backward recomputes each chunk's logits
to form ``dlogits = g * (onehot - softmax)`` and accumulate ``dhidden = dlogits @ W`` and
``dW = dlogits.T @ hidden``. Peak memory is one [chunk, V] block (plus the weight's own gradient)
instead of the logits, their log-softmax and their gradient ([N, V] each).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

HEAD_CHUNK_ELEMENTS = 1 << 21
"""Logit elements per chunk (8 MiB in float32): ``chunk = max(1, HEAD_CHUNK_ELEMENTS // V)`` rows."""


class _ChunkedHeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk: int
    ) -> Tensor:
        N = hidden.shape[0]
        out = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            logits = _chunk_logits(hidden[s:e], weight, bias)  # [c, V] float32
            lse[s:e] = torch.logsumexp(logits, dim=-1)
            out[s:e] = logits.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = min(s + ctx.chunk, hidden.shape[0])
            g = grad_out[s:e, None].float()  # [c, 1]
            dlogits = _chunk_logits(hidden[s:e], weight, bias)
            dlogits.sub_(lse[s:e, None]).exp_().mul_(-g)  # -softmax * g
            dlogits.scatter_add_(-1, targets[s:e, None], g)  # + onehot * g
            d = dlogits.to(weight.dtype)
            if grad_h is not None:
                grad_h[s:e] = d @ weight
            if grad_w is not None:
                grad_w += (d.t() @ hidden[s:e]).float()
            if grad_b is not None:
                grad_b += dlogits.sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``hidden @ W.T + b`` in the model's dtype (as its output layer computes it), then float32."""
    return torch.nn.functional.linear(hidden, weight, bias).float()


def head_token_logps(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *, chunk: int | None = None
) -> Tensor:
    """``log p(targets[n] | hidden[n])`` [N] float32, for ``hidden`` [N, H] and an output layer W [V, H].

    ``chunk``: rows per chunk (default ``HEAD_CHUNK_ELEMENTS // V``).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got hidden {tuple(hidden.shape)}, "
            f"weight {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if chunk is None:
        chunk = max(1, HEAD_CHUNK_ELEMENTS // max(weight.shape[0], 1))
    return _ChunkedHeadLogps.apply(hidden, weight, bias, targets.long(), int(chunk))
