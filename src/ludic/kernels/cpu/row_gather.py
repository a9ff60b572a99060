"""Gathering rows whose backward adds the gradients back without ``index_add_`` / ``scatter_add_``.

``x.index_select(0, index)`` backpropagates through ``index_add_``, which torch's CPU build runs as a
``scatter_add_`` over an expanded index. With one thread that is fast (0.2 ms for 2,550 rows of 192
floats); with two threads and a busy core it took 80-250 ms for the same rows (its parallel path
synchronises its threads many times, and each sync waits for a descheduled thread). Block attention
(``segment_attention.py``) gathers queries, keys, values and outputs in every layer, so its backward
spent a quarter of a training step there on a shared 2-core machine.

Here the scatter is planned once per index (``plan_row_gather``, when the rows are laid out) as a few
*rounds*, each a set of entries whose destination rows are distinct, so each round is a plain gather
and an indexed write (one parallel region each). An index read by each row once is one round; a
shared prompt's keys, read by each of the G tails of its group, take G + 1 rounds of a few rows.
Entries known to carry no gradient (padding slots) are left out of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class RowGather:
    """``out[m] = x[index[m]]`` forward; backward ``dx[index[m]] += g[m]`` for the live entries only.

    ``index`` [M]; ``rounds``: (rows of x, entries of out) pairs, the rows of each round distinct.
    """

    index: Tensor
    rounds: tuple[tuple[Tensor, Tensor], ...]

    def to(self, device: torch.device | str) -> RowGather:
        return RowGather(self.index.to(device), tuple((r.to(device), e.to(device)) for r, e in self.rounds))


def plan_row_gather(index: np.ndarray, live: np.ndarray | None = None) -> RowGather:
    """The gather by ``index`` (int [M]) and its scatter plan over the entries where ``live`` (bool [M],
    default all) is True: entries off it get no gradient back (their gradient must be zero or unused)."""
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    if live is not None and np.asarray(live).size != len(index):
        raise ValueError(f"live has {np.asarray(live).size} entries, index {len(index)}")
    entries = np.arange(len(index)) if live is None else np.flatnonzero(np.asarray(live).reshape(-1))
    rows = index[entries]
    order = np.argsort(rows, kind="stable")
    rows, entries = rows[order], entries[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = rows[1:] != rows[:-1]
    first = np.maximum.accumulate(np.where(new, np.arange(len(rows)), 0)) if len(rows) else rows
    occurrence = np.arange(len(rows)) - first  # 0 for a row's first entry, 1 for its second, ...
    rounds = tuple(
        (torch.from_numpy(rows[occurrence == k].copy()), torch.from_numpy(entries[occurrence == k].copy()))
        for k in range(int(occurrence.max()) + 1 if len(rows) else 0)
    )
    return RowGather(torch.from_numpy(index.copy()), rounds)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, plan: RowGather) -> Tensor:  # type: ignore[override]
        ctx.plan, ctx.shape = plan, x.shape
        return x.index_select(0, plan.index)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous()
        out = grad.new_zeros(ctx.shape)
        for k, (rows, entries) in enumerate(ctx.plan.rounds):
            taken = grad.index_select(0, entries)
            out.index_put_((rows,), taken if k == 0 else out.index_select(0, rows).add_(taken))
        return out, None


def gather_rows(x: Tensor, plan: RowGather) -> Tensor:
    """``x.index_select(0, plan.index)``, backpropagated by ``plan``'s rounds (see the module docstring)."""
    return _GatherRows.apply(x, plan)
