"""RMSNorm in one pass over memory, forward and backward (``rms_norm.cpp``).

Training's RMSNorms (``recompute.py``'s ``RMSNormKeepInput``) keep their input ``x`` and each row's
``r = 1 / sqrt(mean(x^2) + eps)``. Through PyTorch the forward is four passes over ``[rows, hidden]``
(``pow``, ``mean``, ``x * r``, the weight) and the backward eight, each with its own output tensor; a model
has two norms a layer, so at SmolLM2-135M (30 layers, hidden 576) a micro-batch runs 61 of them each way.
This kernel sweeps each row twice while it sits in L1 (its sums, then its outputs), so ``x`` and ``dy`` are
read from memory once and ``dx`` written once:

    forward     y = w * x * r
    backward    dn = dy * w,   dx = r * (dn - n * mean(dn * n)),   dw = sum_rows dy * n,   n = x * r

Values equal PyTorch's to fp32 rounding (other orders of sums), not bit for bit. Built with Ludic's other C++
kernels (``native.py``); ``available()`` is False, logged once, where they cannot be built or the kernel
gives other values than PyTorch's on a probe; the norms then keep PyTorch's ops (``ludic.kernels.select``'s
``rms_norm``). Contiguous fp32 CPU tensors (``takes``).
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch
from torch import Tensor

from ludic.kernels.cpu import native

logger = logging.getLogger(__name__)


_KERNEL = native.ProbedKernel(
    lambda lib: _probe(lib), kernel="RMSNorm", compared_with="PyTorch's RMSNorm",
    fallback="PyTorch's ops run instead", log=logger,
)  # fmt: skip
"""Loaded and probed against PyTorch once per process (``native.ProbedKernel``); a failure logged once."""
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason
_lib = _KERNEL.lib


def takes(x: Tensor, weight: Tensor) -> bool:
    """The kernel reads these: contiguous fp32 CPU tensors, ``weight [hidden]`` for ``x [..., hidden]``."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in (x, weight)) and (
        weight.dim() == 1 and x.dim() >= 1 and x.shape[-1] == weight.shape[0] > 0
    )


def reference(x: Tensor, weight: Tensor, eps: float, dy: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, r, dx, dw) through PyTorch's ops, as ``RMSNormKeepInput`` computes them without the kernel."""
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    n = x * r
    dn = dy * weight
    dx = r * (dn - n * (dn * n).mean(-1, keepdim=True))
    return weight * n, r, dx, (dy * n).reshape(-1, n.shape[-1]).sum(0)


def forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y, r): ``y = weight * x * r`` and each row's ``r`` as ``[..., 1]``."""
    return _forward(_lib(), x, weight, eps)


def backward(
    x: Tensor, weight: Tensor, r: Tensor, dy: Tensor, *, need_x: bool = True, need_w: bool = True
) -> tuple[Tensor | None, Tensor | None]:
    """(dx, dw) from ``forward``'s input, weight and ``r``, each None where not needed."""
    return _backward(_lib(), x, weight, r, dy, need_x, need_w)


def _check(x: Tensor, weight: Tensor, *more: Tensor) -> None:
    if not takes(x, weight) or any(not takes(t, weight) or t.shape != x.shape for t in more):
        described = ", ".join(f"{tuple(t.shape)} {t.dtype} {t.device} contiguous={t.is_contiguous()}" for t in (x, weight, *more))
        raise ValueError(f"the RMSNorm kernel takes contiguous float32 CPU x [..., hidden], weight [hidden] (and dy like x), got {described}")


def _forward(lib: ctypes.CDLL, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    _check(x, weight)
    hidden = weight.shape[0]
    rows = x.numel() // hidden
    y, r = torch.empty_like(x), torch.empty((*x.shape[:-1], 1), dtype=torch.float32)
    lib.ludic_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), r.data_ptr(), rows, hidden, float(eps),
                       torch.get_num_threads())  # fmt: skip
    return y, r


def _backward(
    lib: ctypes.CDLL, x: Tensor, weight: Tensor, r: Tensor, dy: Tensor, need_x: bool, need_w: bool
) -> tuple[Tensor | None, Tensor | None]:
    dy = dy.contiguous()
    _check(x, weight, dy)
    hidden = weight.shape[0]
    rows = x.numel() // hidden
    if r.numel() != rows or r.dtype != torch.float32 or not r.is_contiguous():
        raise ValueError(f"r must hold one float32 per row ({rows}), got {tuple(r.shape)} {r.dtype}")
    dx = torch.empty_like(x) if need_x else None
    dw = torch.empty_like(weight) if need_w else None
    lib.ludic_rms_norm_backward(x.data_ptr(), weight.data_ptr(), r.data_ptr(), dy.data_ptr(),
                                None if dx is None else dx.data_ptr(), None if dw is None else dw.data_ptr(),
                                rows, hidden, torch.get_num_threads())  # fmt: skip
    return dx, dw


def _probe(lib: ctypes.CDLL) -> bool:
    """5 rows of 37 values (two full blocks and a partial one), one of them all zeros."""
    x = torch.linspace(-3.0, 2.0, 5 * 37).view(5, 37).sin() * 4
    x[2] = 0.0
    weight, dy = torch.linspace(0.5, 1.5, 37), torch.linspace(-1.0, 1.0, 5 * 37).view(5, 37).cos()
    want_y, want_r, want_dx, want_dw = reference(x, weight, 1e-5, dy)
    y, r = _forward(lib, x, weight, 1e-5)
    dx, dw = _backward(lib, x, weight, r, dy, True, True)
    close = functools.partial(torch.allclose, rtol=1e-4, atol=1e-5)
    return close(y, want_y) and close(r, want_r) and close(dx, want_dx) and close(dw, want_dw)  # type: ignore[arg-type]
