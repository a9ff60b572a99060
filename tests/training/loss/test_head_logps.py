"""Token log-probs from hidden states in chunks: the values and gradients of the full-logits path,
without any [N, V] tensor."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ludic.training.loss import CompositeLoss, LossTerm, TokenClippedSurrogateLoss, TokenKLLoss
from ludic.training.loss.head_logps import head_token_logps


def reference(hidden, weight, bias, targets):
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def leaves(N: int, H: int, V: int, bias: bool, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).to(dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) * 0.3).to(dtype).requires_grad_(True)
    b = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_(True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, b, targets


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("vocab_chunk", [None, 3, 17, 50])
def test_values_and_gradients_equal_the_log_softmax_path(bias, chunk, vocab_chunk):
    hidden, weight, b, targets = leaves(N=23, H=16, V=50, bias=bias)
    targets[:3] = torch.tensor([0, 49, 17])  # the first and last entries of the vocabulary and of a tile
    upstream = torch.randn(23)
    got = head_token_logps(hidden, weight, b, targets, chunk=chunk, vocab_chunk=vocab_chunk)
    got_grads = torch.autograd.grad((got * upstream).sum(), [t for t in (hidden, weight, b) if t is not None])
    want = reference(hidden, weight, b, targets)
    want_grads = torch.autograd.grad((want * upstream).sum(), [t for t in (hidden, weight, b) if t is not None])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("chunk", "vocab_chunk"), [(None, None), (7, 17), (64, 3)])
def test_kept_logits_give_the_recomputing_path_s_values_and_gradients(bias, chunk, vocab_chunk):
    hidden, weight, b, targets = leaves(N=23, H=16, V=50, bias=bias, seed=4)
    leaves_ = [t for t in (hidden, weight, b) if t is not None]
    upstream = torch.randn(23)
    results = []
    for keep in (False, True):
        got = head_token_logps(hidden, weight, b, targets, chunk=chunk, vocab_chunk=vocab_chunk, keep_logits=keep)
        results.append((got, torch.autograd.grad((got * upstream).sum(), leaves_)))
    (recomputed, grads_recomputed), (kept, grads_kept) = results
    assert torch.equal(kept, recomputed)  # the same forward
    for g_kept, g_recomputed in zip(grads_kept, grads_recomputed, strict=True):
        torch.testing.assert_close(g_kept, g_recomputed, atol=1e-6, rtol=1e-6)


def test_kept_logits_skip_the_backward_s_recomputation_and_refuse_a_second_backward():
    hidden, weight, _, targets = leaves(N=300, H=8, V=1000, bias=False)
    products = {}
    for keep in (False, True):
        out = head_token_logps(hidden, weight, None, targets, vocab_chunk=256, keep_logits=keep)
        with OpNames() as ops:
            out.sum().backward(retain_graph=True)
        products[keep] = sum(n.startswith(("aten.mm", "aten.addmm", "aten.linear")) for n in ops.names)
        if keep:  # its tiles became dlogits in place: reading them again would be wrong, and autograd says so
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()
    assert products == {False: 12, True: 8}  # 4 tiles: logits, dhidden, dW each / dhidden, dW each


def test_keep_logits_must_be_a_bool():
    hidden, weight, _, targets = leaves(N=4, H=8, V=10, bias=False)
    with pytest.raises(TypeError, match="keep_logits must be a bool, got 'yes'"):
        head_token_logps(hidden, weight, None, targets, keep_logits="yes")


def test_bfloat16_weights_get_float32_logps_close_to_the_reference():
    hidden, weight, _, targets = leaves(N=16, H=32, V=64, bias=False, dtype=torch.bfloat16)
    got = head_token_logps(hidden, weight, None, targets, chunk=5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, reference(hidden, weight, None, targets), atol=1e-4, rtol=1e-4)
    got.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16


class LargestTensor(TorchDispatchMode):
    """Records the most elements any single op produced."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_op_materialises_a_quarter_of_the_logits_on_a_150k_vocabulary():
    N, H, V = 256, 16, 150_000
    hidden, weight, _, targets = leaves(N=N, H=H, V=V, bias=False)
    with LargestTensor() as lean:
        head_token_logps(hidden, weight, None, targets).sum().backward()
    assert lean.largest <= N * V // 4  # the [V, H] weight gradient and one [chunk, V] block
    assert torch.isfinite(hidden.grad).all() and weight.grad.abs().sum() > 0
    with LargestTensor() as naive:
        reference(hidden[:8], weight, None, targets[:8]).sum().backward()
    assert naive.largest >= 8 * V  # the reference holds whole [N, V] logits


def test_bad_shapes_are_named():
    hidden, weight, _, targets = leaves(N=4, H=8, V=10, bias=False)
    with pytest.raises(ValueError, match=r"weight \[V, H\]"):
        head_token_logps(hidden, weight[:, :3], None, targets)
    with pytest.raises(ValueError, match=r"targets must be \[N\] = \[4\]"):
        head_token_logps(hidden, weight, None, targets[:3])
    with pytest.raises(ValueError, match="vocab_chunk must be a positive int or None, got 0"):
        head_token_logps(hidden, weight, None, targets, vocab_chunk=0)


def test_no_rows_give_zero_gradients():
    hidden, weight, _, targets = leaves(N=0, H=8, V=10, bias=False)
    out = head_token_logps(hidden, weight, None, targets)
    assert out.shape == (0,)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and hidden.grad.shape == (0, 8)


class OpNames(TorchDispatchMode):
    """Records the name of every aten op run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_backward_runs_no_scatter_and_every_product_is_tile_sized():
    """Tiles over the vocabulary: no product reduces over only a few rows (the earlier row chunks of
    ``2**21 // V`` rows: 42 at V = 49,152), and the one-hot term is an indexed write, not a scatter_add."""
    hidden, weight, _, targets = leaves(N=300, H=8, V=1000, bias=False)
    out = head_token_logps(hidden, weight, None, targets, vocab_chunk=256)
    with OpNames() as ops:
        out.sum().backward()
    assert not [n for n in ops.names if "scatter" in n or "index_add" in n]
    assert ops.names.count("aten.mm.out") == 4  # dW: one full-depth [256, 300] x [300, 8] product per tile


def test_composite_loss_from_logps_equals_its_logits_path():
    torch.manual_seed(0)
    B, T, V = 3, 6, 11
    logits = torch.randn(B, T, V)
    ids = torch.randint(0, V, (B, T))
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0]])
    actor = torch.randn(B, T) * mask
    batch = {"input_ids": ids, "action_mask": mask, "weight": torch.tensor([1.0, -0.5, 0.2]),
             "actor_logps": actor, "ref_logps": actor * 0.9}  # fmt: skip
    loss = CompositeLoss([LossTerm("pg", TokenClippedSurrogateLoss()), LossTerm("kl", TokenKLLoss(), 0.1)])
    from_logits, _ = loss.compute(logits, batch)
    from ludic.training.loss import compute_token_logps

    from_logps, stats = loss.compute_from_logps(compute_token_logps(logits, ids), batch)
    torch.testing.assert_close(from_logps, from_logits)
    assert set(stats) >= {"loss", "pg/loss", "kl/loss", "kl/weight"}


def test_composite_loss_refuses_logps_when_a_term_needs_logits():
    class Raw:
        def compute(self, logits, batch):
            return logits.sum(), {}

    with pytest.raises(TypeError, match=r"\['raw'\] need the logits"):
        CompositeLoss([LossTerm("raw", Raw())]).compute_from_logps(torch.zeros(1, 2), {})
