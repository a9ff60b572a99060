"""Row gathers with a planned backward: the gradients of ``index_select`` without ``index_add_``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ludic.kernels.cpu.row_gather import gather_rows, plan_row_gather


class OpNames(TorchDispatchMode):
    """Records the name of every aten op run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_gradient_adds_up_repeated_rows_as_index_select_does():
    rng = np.random.default_rng(0)
    index = rng.integers(0, 7, size=40)  # rows read up to ~10 times
    plan = plan_row_gather(index)
    assert len(plan.rounds) == np.bincount(index).max()  # one round per repeat of the most-read row
    x = torch.randn(7, 3, 5, requires_grad=True)
    g = torch.randn(40, 3, 5)
    torch.testing.assert_close(gather_rows(x, plan), x.index_select(0, torch.from_numpy(index)))
    (ours,) = torch.autograd.grad(gather_rows(x, plan), x, g)
    (plain,) = torch.autograd.grad(x.index_select(0, torch.from_numpy(index)), x, g)
    torch.testing.assert_close(ours, plain)


def test_dead_entries_send_no_gradient_back():
    index = np.array([0, 1, 1, 2, 2, 2])
    live = np.array([True, True, False, True, False, False])
    plan = plan_row_gather(index, live)
    assert len(plan.rounds) == 1  # the live entries read each row once
    x = torch.zeros(4, 2, requires_grad=True)
    g = torch.arange(12.0).view(6, 2)
    (grad,) = torch.autograd.grad(gather_rows(x, plan), x, g)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0], [2.0, 3.0], [6.0, 7.0], [0.0, 0.0]]))


def test_the_backward_runs_no_index_add_or_scatter_add():
    plan = plan_row_gather(np.array([3, 0, 3, 1, 3, 0]))
    x = torch.randn(4, 8, requires_grad=True)
    out = gather_rows(x, plan)
    with OpNames() as ops:
        out.backward(torch.ones_like(out))
    assert not [n for n in ops.names if "index_add" in n or "scatter" in n], ops.names
    torch.testing.assert_close(x.grad, torch.tensor([2.0, 1.0, 0.0, 3.0])[:, None].expand(4, 8))


def test_a_live_mask_of_another_length_is_refused():
    with pytest.raises(ValueError, match="live has 2 entries, index 3"):
        plan_row_gather(np.array([0, 1, 2]), np.array([True, False]))


def test_an_empty_index_gathers_nothing():
    plan = plan_row_gather(np.zeros(0, dtype=np.int64))
    x = torch.randn(3, 2, requires_grad=True)
    out = gather_rows(x, plan)
    assert out.shape == (0, 2) and plan.rounds == ()
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros(3, 2))
