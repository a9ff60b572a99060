"""``kernels/cpu/swiglu.py``: the gated MLP's elementwise part in one pass gives PyTorch's values to fp32
rounding forward and backward, refuses what it cannot read, is what the recomputing MLP runs when asked
(and the Trainer's micro-batches on the CPU), and falls back to PyTorch's ops where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
from tests.kernels.cpu.test_recompute import assert_close_to_scale, grads_of, llama

from ludic.kernels import select
from ludic.kernels.cpu import native, swiglu
from ludic.kernels.cpu.recompute import GatedMLPDown

needs_kernel = pytest.mark.skipif(
    native.unsupported() is not None, reason=f"the kernel cannot run here: {native.unsupported()}"
)


def _inputs(n: int, seed: int = 0, scale: float = 4.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * scale
    return g, torch.randn(n, generator=gen), torch.randn(n, generator=gen)


@needs_kernel
@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 3 * 1536 + 5])
@pytest.mark.parametrize("threads", [1, 2])
def test_forward_and_backward_equal_pytorch_to_fp32_rounding(n: int, threads: int) -> None:
    g, u, dp = _inputs(n, seed=n)
    g[: min(n, 4)] = torch.tensor([-100.0, 100.0, 0.0, -1.2785])[: min(n, 4)]  # both tails, zero, silu' = 0
    want_p, want_du, want_dg = swiglu.reference(g, u, dp)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        p = swiglu.forward(g, u)
        p2, du, dg = swiglu.backward(g, u, dp.clone())
    finally:
        torch.set_num_threads(before)
    for got, want, name in ((p, want_p, "p"), (p2, want_p, "backward's p"), (du, want_du, "du"), (dg, want_dg, "dg")):
        assert got is not None and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


@needs_kernel
def test_the_input_gradient_is_written_over_dp_and_p_only_when_wanted() -> None:
    g, u, dp = _inputs(40)
    _, _, want_dg = swiglu.reference(g, u, dp)
    given = dp.clone()
    p, _, dg = swiglu.backward(g, u, given, want_p=False)
    assert p is None and dg.data_ptr() == given.data_ptr()
    torch.testing.assert_close(dg, want_dg, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_tensors_it_cannot_read_are_refused_with_their_shapes() -> None:
    g, u, dp = (t.view(4, 10) for t in _inputs(40))
    with pytest.raises(ValueError, match=r"\(10, 4\) torch.float32 cpu contiguous=False"):
        swiglu.forward(g.t(), u.t())
    with pytest.raises(ValueError, match=r"torch.float64"):
        swiglu.forward(g.double(), u.double())
    with pytest.raises(ValueError, match=r"\(4, 9\)"):
        swiglu.backward(g, u, dp[:, :9])
    assert not swiglu.takes(g, u[:, :9]) and swiglu.takes(g, u, dp)


@needs_kernel
@pytest.mark.parametrize("needs", ["all", "weight only", "inputs only"])
def test_the_recomputing_mlp_gives_the_same_gradients_through_the_kernel(needs: str) -> None:
    torch.manual_seed(3)
    rows, inter, out = 37, 48, 20
    values = (torch.randn(rows, inter) * 3, torch.randn(rows, inter), torch.randn(out, inter), torch.randn(out))
    results = []
    for native_on in (False, True):
        g, u, w, b = (v.clone().requires_grad_(needs != ("weight only" if i < 2 else "inputs only"))
                      for i, v in enumerate(values))  # fmt: skip
        y = GatedMLPDown.apply(g, u, w, b, False, native_on)
        wanted = [t for t in (g, u, w, b) if t.requires_grad]
        grads = torch.autograd.grad((y * torch.linspace(-1, 1, out)).sum(), wanted)
        results.append((y.detach(), grads))
    (y_off, grads_off), (y_on, grads_on) = results
    torch.testing.assert_close(y_on, y_off, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads_on, grads_off, strict=True):
        assert_close_to_scale(got, want, needs)


@needs_kernel
def test_a_model_through_the_kernel_gives_its_own_layers_values_and_the_kernel_runs(monkeypatch) -> None:
    calls: list[str] = []
    for name in ("forward", "backward"):
        real = getattr(swiglu, name)
        monkeypatch.setattr(swiglu, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    model = llama(layers=2)
    ids = torch.randint(0, 96, (2, 30))
    plain, plain_grads = grads_of(model, ids, enabled=False)
    assert calls == []
    lean, lean_grads = grads_of(model, ids, native_swiglu=True)
    assert calls == ["forward", "forward", "backward", "backward"]  # two MLPs, each way
    torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)
    for name, grad in plain_grads.items():
        assert_close_to_scale(lean_grads[name], grad, name)


def test_without_a_compiler_the_mlp_keeps_pytorchs_ops_and_says_why_once(monkeypatch, fresh_build, caplog) -> None:
    monkeypatch.setenv("CXX", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.cpu.swiglu"):
        assert not swiglu.available() and not swiglu.available()
    assert len([r for r in caplog.records if "SwiGLU kernel is off" in r.getMessage()]) == 1
    assert not select("cpu", "auto").swiglu and select("cpu", "auto").recompute_layers
    with pytest.raises(RuntimeError, match="kernel cannot run here"):
        select("cpu", "on")
    model = llama(layers=1)
    ids = torch.randint(0, 96, (1, 12))
    plain, _ = grads_of(model, ids, enabled=False)
    fallback, _ = grads_of(model, ids, native_swiglu=True)  # asked for, unavailable: PyTorch's ops
    torch.testing.assert_close(fallback, plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="the SwiGLU kernel is unavailable"):
        swiglu.forward(torch.ones(3), torch.ones(3))
