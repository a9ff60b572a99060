"""``kernels/cpu/rms_norm.py``: RMSNorm in one pass gives PyTorch's values and gradients to fp32 rounding,
refuses what it cannot read, is what the recomputing norms run when asked (and the Trainer's micro-batches on
the CPU), and falls back to PyTorch's ops where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
from tests.kernels.cpu.test_recompute import assert_close_to_scale, grads_of, llama

from ludic.kernels import select
from ludic.kernels.cpu import native, rms_norm
from ludic.kernels.cpu.recompute import RMSNormKeepInput

needs_kernel = pytest.mark.skipif(
    native.unsupported() is not None, reason=f"the kernel cannot run here: {native.unsupported()}"
)


def _inputs(shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    return x, torch.rand(shape[-1], generator=gen) + 0.5, torch.randn(shape, generator=gen)


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 16), (3, 17), (2, 5, 64), (33, 576), (7, 1000)])
@pytest.mark.parametrize("threads", [1, 2])
def test_values_and_gradients_equal_pytorch_to_fp32_rounding(shape: tuple[int, ...], threads: int) -> None:
    x, w, dy = _inputs(shape, seed=shape[-1])
    x.view(-1, shape[-1])[0] = 0.0  # a row of zeros: r = 1 / sqrt(eps)
    want_y, want_r, want_dx, want_dw = rms_norm.reference(x, w, 1e-6, dy)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, r = rms_norm.forward(x, w, 1e-6)
        dx, dw = rms_norm.backward(x, w, r, dy)
    finally:
        torch.set_num_threads(before)
    assert r.shape == (*shape[:-1], 1)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r, want_r, rtol=1e-5, atol=1e-5)
    assert dx is not None and dw is not None
    assert_close_to_scale(dx, want_dx, "dx")
    assert_close_to_scale(dw, want_dw, "dw")


@needs_kernel
def test_only_the_wanted_gradients_are_made() -> None:
    x, w, dy = _inputs((4, 48))
    _, r = rms_norm.forward(x, w, 1e-5)
    dx, dw = rms_norm.backward(x, w, r, dy, need_x=False)
    assert dx is None and dw is not None
    dx, dw = rms_norm.backward(x, w, r, dy, need_w=False)
    assert dx is not None and dw is None


@needs_kernel
def test_tensors_it_cannot_read_are_refused_with_their_shapes() -> None:
    x, w, dy = _inputs((4, 48))
    with pytest.raises(ValueError, match=r"\(4, 48\) torch.float32 cpu contiguous=False"):
        rms_norm.forward(x.t().contiguous().t(), w, 1e-5)
    with pytest.raises(ValueError, match=r"\(47,\)"):
        rms_norm.forward(x, w[:47], 1e-5)
    with pytest.raises(ValueError, match=r"torch.float64"):
        rms_norm.forward(x.double(), w.double(), 1e-5)
    _, r = rms_norm.forward(x, w, 1e-5)
    with pytest.raises(ValueError, match=r"one float32 per row \(4\)"):
        rms_norm.backward(x, w, r[:3], dy)
    with pytest.raises(ValueError, match=r"\(4, 40\)"):
        rms_norm.backward(x, w, r, dy[:, :40])


@needs_kernel
def test_the_recomputing_norm_gives_the_same_gradients_through_the_kernel() -> None:
    x, w, dy = _inputs((2, 9, 40), seed=4)
    results = []
    for native_on in (False, True):
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = RMSNormKeepInput.apply(xl, wl, 1e-5, native_on)
        results.append((y.detach(), *torch.autograd.grad((y * dy).sum(), (xl, wl))))
    for got, want, name in zip(results[1], results[0], ("y", "dx", "dw"), strict=True):
        assert_close_to_scale(got, want, name)


@needs_kernel
def test_a_model_through_the_kernel_gives_its_own_layers_values_and_the_kernel_runs(monkeypatch) -> None:
    calls: list[str] = []
    for name in ("forward", "backward"):
        real = getattr(rms_norm, name)
        monkeypatch.setattr(rms_norm, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    model = llama(layers=2)
    ids = torch.randint(0, 96, (2, 30))
    plain, plain_grads = grads_of(model, ids, enabled=False)
    assert calls == []
    lean, lean_grads = grads_of(model, ids, native_rms_norm=True, native_swiglu=True)
    assert calls.count("forward") == 5 and calls.count("backward") == 5  # two norms a layer and the final one
    torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)
    for name, grad in plain_grads.items():
        assert_close_to_scale(lean_grads[name], grad, name)


def test_without_a_compiler_the_norms_keep_pytorchs_ops_and_say_why_once(monkeypatch, fresh_build, caplog) -> None:
    monkeypatch.setenv("CXX", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.cpu.rms_norm"):
        assert not rms_norm.available() and not rms_norm.available()
    assert len([r for r in caplog.records if "RMSNorm kernel is off" in r.getMessage()]) == 1
    assert not select("cpu", "auto").rms_norm and select("cpu", "auto").recompute_layers
    model = llama(layers=1)
    ids = torch.randint(0, 96, (1, 12))
    plain, _ = grads_of(model, ids, enabled=False)
    fallback, _ = grads_of(model, ids, native_rms_norm=True)  # asked for, unavailable: PyTorch's ops
    torch.testing.assert_close(fallback, plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="the RMSNorm kernel is unavailable"):
        rms_norm.forward(torch.ones(2, 3), torch.ones(3), 1e-5)
