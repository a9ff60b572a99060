"""A gated MLP's elementwise part in one pass over memory, forward and backward (``swiglu.cpp``).

Training's gated MLPs (``recompute.py``'s ``GatedMLPDown``) keep the gate and up projections ``g`` and
``u`` and recompute the rest in the backward. Through PyTorch that is two passes forward (``silu``, ``mul``)
and five backward (``silu``, ``a * u``, ``dp * a``, ``dp * u``, ``silu_backward``), each over
``[rows, intermediate]`` tensors that come from memory, not cache (a micro-batch's 500-900 rows at SmolLM2's
intermediate size 1,536 are 3-5 MB each): a pass costs about what it moves. This kernel reads each input once
and writes each output once, forward and backward:

    forward     p = silu(g) * u
    backward    p = silu(g) * u,   du = dp * silu(g),   dg = dp * u * s * (1 + g * (1 - s)),   s = sigmoid(g)

Values equal PyTorch's to fp32 rounding (its own exponential, tests), not bit for bit. Built with Ludic's
other C++ kernels (``native.py``); ``available()`` is False, logged once, where they cannot be built or this
kernel gives other values than PyTorch's on a probe; the MLP then keeps PyTorch's ops
(``ludic.kernels.select``'s ``swiglu``). fp32 CPU tensors of one shape, contiguous (``takes``).
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ludic.kernels.cpu import native

logger = logging.getLogger(__name__)


_KERNEL = native.ProbedKernel(
    lambda lib: _probe(lib), kernel="SwiGLU", compared_with="PyTorch's silu",
    fallback="PyTorch's elementwise ops run instead", log=logger,
)  # fmt: skip
"""Loaded and probed against PyTorch once per process (``native.ProbedKernel``); a failure logged once."""
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason
_lib = _KERNEL.lib


def takes(*tensors: Tensor) -> bool:
    """The kernel reads these: contiguous fp32 CPU tensors of one shape."""
    first = tensors[0]
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() and t.shape == first.shape
        for t in tensors
    )


def reference(g: Tensor, u: Tensor, dp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``backward``'s (p, du, dg) through PyTorch's ops, as ``GatedMLPDown`` computes them without the kernel."""
    a = F.silu(g)
    return a * u, dp * a, torch.ops.aten.silu_backward(dp * u, g)


def forward(g: Tensor, u: Tensor) -> Tensor:
    """``silu(g) * u`` in one pass."""
    return _forward(_lib(), g, u)


def backward(g: Tensor, u: Tensor, dp: Tensor, *, want_p: bool = True) -> tuple[Tensor | None, Tensor, Tensor]:
    """(p, du, dg) in one pass; ``dg`` is written over ``dp`` (which the caller gives up); p None unless ``want_p``."""
    return _backward(_lib(), g, u, dp, want_p)


def _check(*tensors: Tensor) -> None:
    if not takes(*tensors):
        described = ", ".join(f"{tuple(t.shape)} {t.dtype} {t.device} contiguous={t.is_contiguous()}" for t in tensors)
        raise ValueError(f"the SwiGLU kernel takes contiguous float32 CPU tensors of one shape, got {described}")


def _forward(lib: ctypes.CDLL, g: Tensor, u: Tensor) -> Tensor:
    _check(g, u)
    p = torch.empty_like(g)
    lib.ludic_swiglu(g.data_ptr(), u.data_ptr(), p.data_ptr(), g.numel(), torch.get_num_threads())
    return p


def _backward(lib: ctypes.CDLL, g: Tensor, u: Tensor, dp: Tensor, want_p: bool) -> tuple[Tensor | None, Tensor, Tensor]:
    _check(g, u, dp)
    p = torch.empty_like(g) if want_p else None
    du = torch.empty_like(g)
    lib.ludic_swiglu_backward(g.data_ptr(), u.data_ptr(), dp.data_ptr(), None if p is None else p.data_ptr(),
                              du.data_ptr(), dp.data_ptr(), g.numel(), torch.get_num_threads())  # fmt: skip
    return p, du, dp


def _probe(lib: ctypes.CDLL) -> bool:
    """37 values (two full blocks and a partial one) from -100 to 100: both tails of the exponential."""
    g = torch.linspace(-100.0, 100.0, 37)
    u, dp = torch.linspace(-2.0, 3.0, 37).cos(), torch.linspace(-1.0, 1.5, 37).sin()
    want_p, want_du, want_dg = reference(g, u, dp)
    p, du, dg = _backward(lib, g, u, dp.clone(), True)
    close = functools.partial(torch.allclose, rtol=1e-5, atol=1e-6)
    return close(_forward(lib, g, u), want_p) and close(p, want_p) and close(du, want_du) and close(dg, want_dg)
