"""The training forward/backward's linear layers through oneDNN on the CPU.

Torch's CPU builds run ``F.linear`` and its backward through MKL's sgemm, which on the AMD EPYC this
library is benchmarked on reaches about 105 GFLOP/s on one core at training shapes (4,688 rows x
256-1,536 features), while oneDNN's inner product reaches about 240 (``bench/bench_train_matmuls.py``).
The weight goes in as it is (oneDNN lays it out for itself): reordering it first through
``_reorder_linear_weight`` cost about 75 us a call whatever its size, for 1%-3% less matmul time at
thousands of rows. Nothing is cached across calls or optimizer steps.

Inside ``onednn_linears(model)`` every ``nn.Linear`` of the model (LoRA's and the output layer's
included) whose input and weight are plain fp32 CPU tensors runs as ``OneDNNLinear``:

    forward      y  = x W^T + b               oneDNN inner product
    grad input   dx = dy W                    oneDNN inner product on W^T
    grad weight  dW = dy^T x                  oneDNN's backward-weights primitive, which reduces over the
    grad bias    db = sum over rows of dy     rows itself (no transposed copies of x or dy), both at once

Where oneDNN is not faster it is not used (measured per product, 1 and 2 threads, on 128-4,688 rows,
``bench/bench_train_matmuls.py``): inputs of fewer than ``min_rows`` rows run ``F.linear`` as they are:
``MIN_ROWS`` for a layer narrower than ``WIDE_FEATURES`` on either side (at 256-600 rows of a 128- or
256-wide layer oneDNN is 0.6x-0.95x with 2 threads), ``WIDE_MIN_ROWS`` for a wider one (SmolLM2-135M's
576/1,536-wide layers at 256-470 rows, 2 threads, AMD EPYC Zen 4: forward 1.02x-1.16x, grad input
1.06x-1.29x). The backward-weights primitive ran 1.3x-2x MKL's ``dy^T @ x`` from 600 rows on with one
thread on an Intel Xeon (Emerald Rapids; 128-1,536 features); with more threads it pays there only from
``MIN_WEIGHT_GRAD_MACS`` multiply-adds (0.46x-0.95x below, e.g. 600-2,400 rows of a 128 -> 64 or 128 -> 128
layer). On AMD CPUs it did not pay: 0.33x-1.02x MKL over every shape measured on a Zen 4 EPYC (128-1,536
features, 128-4,688 rows, 1 and 2 threads, torch 2.13; 0.60x-1.02x at SmolLM2-135M's shapes at 470-600 rows),
so there the weight gradient stays on MKL.

Without AVX-512 (an AMD EPYC Zen 3, AVX2, 2 threads, SmolLM2-135M's shapes at 256-600 rows) oneDNN's inner
product paid only in the forward of a layer that widens (576 -> 1,536: 1.07x-1.31x; 0.79x-0.99x on the
others) and never for the grad input (0.77x-0.96x). A forward-backward of the main job's model took 0.88x
the time with every layer on MKL as with the wide ones on oneDNN, and the same with only the widening
forwards on oneDNN (10 interleaved rounds), so on such a CPU no layer runs on oneDNN (``forward_pays``).

Results equal torch's to fp32 rounding (relative gradient difference ~1e-6), not bit for bit; other
dtypes, devices and tensor subclasses take torch's own path unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ludic.kernels.cpu.native import cpu_isas
from ludic.kernels.private_ops import LINEAR_BACKWARD_WEIGHTS, LINEAR_POINTWISE, works

MIN_ROWS = 512
"""Fewer input rows than this: ``F.linear`` (MKL), forward and backward (layers narrower than ``WIDE_FEATURES``)."""
WIDE_FEATURES = 512
WIDE_MIN_ROWS = 256
"""A layer at least ``WIDE_FEATURES`` wide on both sides goes to oneDNN from this many rows."""
MIN_WEIGHT_GRAD_MACS = 1 << 26
"""With more than one torch thread, the weight gradient goes to oneDNN only from this many multiply-adds
(rows x in x out; e.g. 1,200 rows of a 256 -> 256 layer: 1.23x MKL at 2 threads)."""


def min_rows(in_features: int, out_features: int) -> int:
    """The fewest input rows from which a layer's forward and grad input pay on oneDNN (module docstring)."""
    return WIDE_MIN_ROWS if min(in_features, out_features) >= WIDE_FEATURES else MIN_ROWS


@functools.cache
def avx512() -> bool:
    """This CPU runs AVX-512 (torch's dispatch level): where oneDNN's inner product was measured to pay."""
    return "avx512" in cpu_isas()


def forward_pays(rows: int, in_features: int, out_features: int) -> bool:
    """A layer's forward on ``rows`` input rows, and then its input gradient, are faster on oneDNN than on
    MKL (module docstring): from ``min_rows`` on a CPU with AVX-512, never without."""
    return avx512() and rows >= min_rows(in_features, out_features)


@functools.cache
def amd_cpu() -> bool:
    """This machine's CPU is AMD's (``/proc/cpuinfo``; False where it cannot be read): oneDNN's
    backward-weights primitive measured slower than MKL there at every shape (module docstring)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in f)
    except OSError:
        return False


def onednn_available() -> bool:
    """This torch build has oneDNN and runs the two private inner-product ops used here (probed once
    per process, ``ludic.kernels.private_ops``; when not, layers keep torch's own linear)."""
    return torch.backends.mkldnn.is_available() and works(LINEAR_POINTWISE) and works(LINEAR_BACKWARD_WEIGHTS)


def inner_product(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` for a 2-D contiguous ``x`` [rows, in] and a plain ``weight`` [out, in]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def as_rows(t: Tensor) -> Tensor:
    """``t`` as a contiguous 2-D [rows, features] tensor."""
    flat = t.reshape(-1, t.shape[-1])
    return flat if flat.is_contiguous() else flat.contiguous()


class OneDNNLinear(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` with the forward and all three gradients computed by oneDNN."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        x2 = as_rows(x)
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        out = inner_product(x2, weight, bias)  # [rows, out]
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x2, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x, grad_w, grad_b = linear_grads(
            as_rows(grad_out), x2, weight, need_x=need_x, need_w=need_w, need_b=need_b and ctx.has_bias
        )
        return None if grad_x is None else grad_x.view(ctx.x_shape), grad_w, grad_b


def linear_grads(
    dy: Tensor, x: Tensor | None, weight: Tensor, *, need_x: bool, need_w: bool, need_b: bool, onednn: bool = True
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dW, db) of ``y = x W^T + b`` for 2-D contiguous ``dy`` [rows, out] and ``x`` [rows, in] (read only
    for dW: None when ``need_w`` is False); each None where not needed. ``onednn``: on oneDNN where it pays
    (see the module docstring), else MKL."""
    grad_x = grad_w = grad_b = None
    if need_x:  # dx = dy @ W = dy @ (W^T)^T: oneDNN reads the transposed view as it is (no copy of W^T)
        grad_x = inner_product(dy, transposed_weight(weight)) if onednn else dy.mm(weight)
    if need_w and x is None:
        raise ValueError("linear_grads needs the layer's input x for the weight gradient")
    if need_w and onednn and _weight_grad_pays(*x.shape, dy.shape[1]):
        grad_w, grad_b = weight_and_bias_grads(dy, x, weight, need_b)
    else:
        grad_w = dy.t().mm(x) if need_w else None
        grad_b = dy.sum(0) if need_b else None
    return grad_x, grad_w, grad_b


def transposed_weight(weight: Tensor) -> Tensor:
    """``W^T`` for oneDNN's inner product: the strided view where this torch's op reads one correctly
    (``takes_transposed_weight``), else a contiguous copy."""
    return weight.t() if takes_transposed_weight() else weight.t().contiguous()


@functools.cache
def takes_transposed_weight() -> bool:
    """oneDNN's inner product gives the same values for a transposed weight view as for its contiguous copy
    (probed once per process). The view saves copying every weight in each micro-batch's backward: at
    SmolLM2-135M's MLP shapes (858 rows) the input gradient took 5.1 ms instead of 7.7 with the copy, the
    same bits (this torch reorders the strided weight into its layout itself)."""
    dy = torch.linspace(-1.0, 1.0, 3 * 20).view(3, 20)
    weight = torch.linspace(-0.5, 0.7, 20 * 7).view(20, 7).sin()
    try:
        return torch.equal(inner_product(dy, weight.t()), inner_product(dy, weight.t().contiguous()))
    except RuntimeError:
        return False


def _weight_grad_pays(rows: int, in_features: int, out_features: int) -> bool:
    if amd_cpu():
        return False
    return torch.get_num_threads() == 1 or rows * in_features * out_features >= MIN_WEIGHT_GRAD_MACS


def weight_and_bias_grads(dy: Tensor, x: Tensor, weight: Tensor, with_bias: bool) -> tuple[Tensor, Tensor | None]:
    """(``dy^T @ x`` [out, in], ``dy.sum(0)`` or None) for ``dy`` [rows, out] and ``x`` [rows, in].

    oneDNN's inner-product backward-weights primitive takes the rows as its reduction, so neither
    input is transposed; its tensors are oneDNN's own (``to_mkldnn``: one contiguous copy each)."""
    grad_w, grad_b = torch.ops.aten.mkldnn_linear_backward_weights(
        dy.to_mkldnn(), x.to_mkldnn(), weight.detach().to_mkldnn(), with_bias
    )
    return grad_w.to_dense(), grad_b.to_dense() if with_bias else None


_PLAIN = (Tensor, torch.nn.Parameter)


def runs_on_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return (
        type(x) in _PLAIN
        and type(weight) in _PLAIN
        and (bias is None or type(bias) in _PLAIN)
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and (bias is None or bias.dtype == torch.float32)
        and x.dim() >= 2
        and x.shape[-1] > 0
        and forward_pays(x.numel() // x.shape[-1], weight.shape[1], weight.shape[0])
    )


def _onednn_forward(layer: nn.Linear) -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        weight, bias = layer.weight, layer.bias
        if runs_on_onednn(x, weight, bias):
            return OneDNNLinear.apply(x, weight, bias)
        return F.linear(x, weight, bias)

    return forward


@contextlib.contextmanager
def onednn_linears(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, ``model``'s ``nn.Linear`` layers (exactly that class: LoRA's and the output layer's
    included, quantised subclasses not) run fp32 CPU inputs on oneDNN, forward and backward; a no-op when
    ``enabled`` is False or this torch cannot run the ops (``onednn_available``).

    Layers are switched by an instance ``forward`` for the block's duration, so a backward run inside the
    block, and the forward that gradient checkpointing recomputes in it, take the same path as the
    forward. The caller passes ``enabled=False`` for FSDP2 models (their layers gather sharded weights
    around the forward; ``training.layout.forward.micro_batch_kernels`` does), so kernels import no
    training code."""
    if not enabled or not onednn_available():
        yield
        return
    switched = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in m.__dict__]
    for layer in switched:
        layer.forward = _onednn_forward(layer)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for layer in switched:
            del layer.forward
