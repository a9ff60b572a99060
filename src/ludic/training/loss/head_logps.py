"""Token log-probs straight from the last hidden states, tile by tile through the output layer.

``log_softmax(hidden @ W.T + b)[target]`` for N scored positions without ever holding the [N, V]
logits: the forward keeps only the [N] logsumexp, and the backward recomputes each tile's logits
to form ``dlogits = g * (onehot - softmax)`` and accumulate ``dhidden = dlogits @ W`` and
``dW = dlogits.T @ hidden``. Peak memory is one tile (plus the weight's own gradient) instead of the
logits, their log-softmax and their gradient ([N, V] each).

With ``keep_logits`` the forward keeps each tile's float32 logits ([N, V] in all) and the backward
reads them instead of recomputing them: one product of three fewer in the backward, for 4 x V bytes a
scored position (the trainer counts them in its activation budget, ``training/layout/micro_batch_plan.py``). At
SmolLM2-135M's head (680 positions, V = 49,152, 2 threads) that took a micro-batch's head backward from
0.66 s to ~0.45 s.

Tiles run over the vocabulary as well as the rows, so every product is a large one: a slice of
``vc`` output rows of W against up to ``HEAD_TILE_ROWS`` hidden states. Row chunks alone (the earlier
layout) left a few dozen rows per chunk at a 49k vocabulary, and ``dW`` summed a [V, H] product per
chunk over a reduction of those few rows; by vocabulary tiles ``dW`` is written once per row chunk,
each slice a full-depth product. At SmolLM2-135M's head (1,744 action tokens, V = 49,152, H = 576)
that took the head's forward and backward from 7.3 s to ~3 s of one core's time (interleaved
measurements on a busy machine; the lead re-measures).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

HEAD_TILE_ELEMENTS = 1 << 20
"""Logit elements per tile (4 MiB in float32): ``vc = HEAD_TILE_ELEMENTS // rows`` vocabulary entries.

A tile that stays in cache while its exp and sums run: at SmolLM2-135M's head (V = 49,152, H = 576, 2
threads, AMD EPYC Zen 4) the recomputing forward and backward took 0.69 / 0.99 / 2.58 s at 512 / 680 /
1,800 rows against 0.82 / 1.06 / 3.23 s with 16 MiB tiles (a [469, 576] x [576, vc] product ran at 172
GFLOP/s with vc = 2,048 and 104 with vc = 8,943); 2 MiB tiles read the same."""
HEAD_TILE_ROWS = 4096
"""Hidden states per row chunk (at most)."""


class _TiledHeadLogps(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, rows: int, vc: int,
        keep_logits: bool,
    ) -> Tensor:
        N, V = hidden.shape[0], weight.shape[0]
        out = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.full((N,), float("-inf"), dtype=torch.float32, device=hidden.device)
        kept: list[Tensor] = []
        for s in range(0, N, rows):
            e = min(s + rows, N)
            h, lse_r = hidden[s:e], lse[s:e]
            for v0, hits, cols in _tiles(targets[s:e], V, vc):
                logits = _tile_logits(h, weight, bias, v0, vc)  # [r, vc] float32
                torch.logaddexp(lse_r, torch.logsumexp(logits, dim=-1), out=lse_r)
                out[s + hits] = logits[hits, cols]
                if keep_logits:
                    kept.append(logits)
        out.sub_(lse)
        # The kept tiles are saved tensors: the backward turns them into dlogits in place, so a second
        # backward through the same graph fails on autograd's version check instead of reading them.
        ctx.save_for_backward(hidden, weight, bias, targets, lse, *kept)
        ctx.rows, ctx.vc = rows, vc
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, targets, lse, *kept = ctx.saved_tensors
        kept_tiles = iter(kept)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden.shape[0], weight.shape[0]
        rows, vc = ctx.rows, ctx.vc
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = _weight_grad_buffer(weight, zeroed=not 0 < N <= rows) if need_w else None
        grad_b = torch.zeros(V, dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, N, rows):
            e = min(s + rows, N)
            h, g = hidden[s:e], grad_out[s:e, None].float()  # [r, H], [r, 1]
            for v0, hits, cols in _tiles(targets[s:e], V, vc):
                v1 = min(v0 + vc, V)
                d = next(kept_tiles) if kept else _tile_logits(h, weight, bias, v0, vc)
                d.sub_(lse[s:e, None]).exp_().mul_(-g)  # -softmax * g
                d[hits, cols] += g[hits, 0]  # + onehot * g (one entry per row: no scatter_add)
                dm = d.to(weight.dtype)
                if grad_h is not None:
                    grad_h[s:e].addmm_(dm, weight[v0:v1])
                if grad_w is not None:
                    _add_weight_grad(grad_w[v0:v1], dm, h, first=s == 0)
                if grad_b is not None:
                    grad_b[v0:v1] += d.sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _tiles(targets: Tensor, V: int, vc: int) -> list[tuple[int, Tensor, Tensor]]:
    """(first vocabulary entry, rows whose target falls in the tile, those targets' columns) per tile."""
    tile = torch.div(targets, vc, rounding_mode="floor")
    order = torch.argsort(tile, stable=True)
    counts = torch.bincount(tile, minlength=-(-V // vc)).tolist()
    out, at = [], 0
    for k, count in enumerate(counts):
        hits = order[at : at + count]
        out.append((k * vc, hits, targets[hits] - k * vc))
        at += count
    return out


def _tile_logits(h: Tensor, weight: Tensor, bias: Tensor | None, v0: int, vc: int) -> Tensor:
    """``h @ W[v0:v0+vc].T + b`` in the model's dtype (as its output layer computes it), then float32."""
    v1 = min(v0 + vc, weight.shape[0])
    return torch.nn.functional.linear(h, weight[v0:v1], None if bias is None else bias[v0:v1]).float()


def _weight_grad_buffer(weight: Tensor, *, zeroed: bool) -> Tensor:
    """float32 [V, H]; left unfilled when one row chunk writes every slice once."""
    make = torch.zeros if zeroed else torch.empty
    return make(weight.shape, dtype=torch.float32, device=weight.device)


def _add_weight_grad(slice_: Tensor, d: Tensor, h: Tensor, *, first: bool) -> None:
    """``slice_ (+)= d.T @ h``, written in place where the dtypes allow (no [vc, H] temporary)."""
    if d.dtype == slice_.dtype:
        if first:
            torch.mm(d.t(), h, out=slice_)
        else:
            slice_.addmm_(d.t(), h)
    elif first:
        slice_.copy_(d.t() @ h)
    else:
        slice_.add_((d.t() @ h).float())


def head_token_logps(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    *,
    chunk: int | None = None,
    vocab_chunk: int | None = None,
    keep_logits: bool = False,
) -> Tensor:
    """``log p(targets[n] | hidden[n])`` [N] float32, for ``hidden`` [N, H] and an output layer W [V, H].

    ``chunk``: rows per row chunk (default ``min(N, HEAD_TILE_ROWS)``); ``vocab_chunk``: vocabulary
    entries per tile (default ``HEAD_TILE_ELEMENTS // chunk``); ``keep_logits``: keep the float32
    logits (4 x N x V bytes) for the backward instead of recomputing them there.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got hidden {tuple(hidden.shape)}, "
            f"weight {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if not isinstance(keep_logits, bool):
        raise TypeError(f"keep_logits must be a bool, got {keep_logits!r}")
    for name, value in (("chunk", chunk), ("vocab_chunk", vocab_chunk)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    V = weight.shape[0]
    rows = chunk if chunk is not None else max(1, min(hidden.shape[0], HEAD_TILE_ROWS))
    vc = vocab_chunk if vocab_chunk is not None else HEAD_TILE_ELEMENTS // rows
    vc = int(min(max(vc, 1), max(V, 1)))
    return _TiledHeadLogps.apply(hidden, weight, bias, targets.long(), int(rows), vc, keep_logits)
