"""The embedded engine's decoding matmuls through Ludic's own AVX-512 or AVX2 kernel (``decode_gemm.cpp``).

A decoding step multiplies every weight of the model by one row per live sequence (4-64 rows), so the
step is a stream of the whole model from memory plus a few FLOPs per byte. oneDNN's packed inner product
(the lean decoder's default before this) ran those matmuls at 151 GFLOP/s for 32 rows on the 2-core
Xeon the issue-35 bench runs on (Emerald Rapids): it reads each 48-column panel of a weight from memory
while the first rows wait for it, then computes the other rows from cache, and the memory sits idle
meanwhile. This kernel prefetches the next panel group while the current one's later rows are computed,
so the stream overlaps the arithmetic: all of SmolLM2-135M's decoding matmuls (121 weights, 538 MB) in
39.6 ms against oneDNN's 55.8 at 32 rows (1.41x), 24.6 vs 34.1 ms at 8 rows, 19.3 vs 29.3 ms at one
row (27.9 GB/s, this machine's memory bandwidth), measured interleaved, 2 threads, weights streamed as in
a real step; the engine's 32-row decoding step went from 72-82 ms to ~60 ms. Each output is one fp32 sum
of K fused multiply-adds in order, so values match ``F.linear`` to fp32 rounding, as oneDNN's do (tests).

The kernel is built with Ludic's other C++ kernels into one library at first use (``native.py``: the
compiler, the cache folder, the OpenMP runtime it shares with torch). ``available()`` is False, with the
reason logged once, where that library cannot be built here (off x86-64 Linux, without AVX2 or a
compiler) or when the kernel gives other values than ``F.linear`` on a probe; the lean decoder then keeps
oneDNN's packed matmuls (``ludic.kernels.select``'s ``decode_gemm``).
"""

from __future__ import annotations

import ctypes
import logging

import torch
import torch.nn.functional as F

from ludic.kernels.cpu import native

logger = logging.getLogger(__name__)

LANES = 16
"""Output columns per packed panel: ``pack`` needs ``out_features`` to be a multiple of this."""


_KERNEL = native.ProbedKernel(
    lambda lib: _probe(lib), kernel="decoding matmul", compared_with="F.linear",
    fallback="oneDNN's packed matmuls run instead", log=logger,
)  # fmt: skip
"""Loaded and probed against PyTorch once per process (``native.ProbedKernel``); a failure logged once."""
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason
_lib = _KERNEL.lib


def _probe(lib: ctypes.CDLL) -> bool:
    """A 19-row, 112-column product with a bias: full and partial row blocks, groups of 3 and 1 panels, prefetching."""
    x = torch.linspace(-1.0, 1.0, 19 * 24).view(19, 24)
    weight = torch.linspace(-0.5, 0.7, 112 * 24).view(112, 24).sin()
    bias = torch.linspace(0.1, 0.4, 112)
    got = _linear(lib, x, _pack(weight), bias)
    return torch.allclose(got, F.linear(x, weight, bias), atol=1e-5)


def packable(weight: torch.Tensor) -> bool:
    """``pack`` takes this weight: a 2-D fp32 CPU tensor whose ``out_features`` is a multiple of ``LANES``."""
    return (
        weight.dim() == 2 and weight.dtype == torch.float32 and weight.device.type == "cpu"
        and weight.shape[0] % LANES == 0 and weight.shape[0] > 0 and weight.shape[1] > 0
    )  # fmt: skip


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight [out, in]`` in the kernel's layout, ``[out / 16, in, 16]`` (``shape[1]`` is ``in``)."""
    if not packable(weight):
        raise ValueError(
            f"pack needs a 2-D float32 CPU weight with out_features a multiple of {LANES}; "
            f"got {tuple(weight.shape)} {weight.dtype} on {weight.device}"
        )
    _lib()  # packing for a kernel that cannot run is a mistake: say why here
    return _pack(weight)


def pack_concat(weights: list[torch.Tensor]) -> torch.Tensor:
    """``pack(torch.cat(weights))`` in one copy: each weight's panels written straight into their place."""
    bad = [tuple(w.shape) for w in weights if not packable(w)]
    if not weights or bad or len({w.shape[1] for w in weights}) != 1:
        raise ValueError(f"pack_concat needs packable weights of one in_features; got {[tuple(w.shape) for w in weights]}")
    _lib()
    in_features = weights[0].shape[1]
    out = torch.empty((sum(w.shape[0] for w in weights) // LANES, in_features, LANES), dtype=torch.float32)
    panel = 0
    for w in weights:
        panels = w.shape[0] // LANES
        out[panel : panel + panels].copy_(w.detach().reshape(panels, LANES, in_features).transpose(1, 2))
        panel += panels
    return out


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """Panel p, line k = ``weight[16p : 16p + 16, k]``: a transposed copy of each block of 16 rows."""
    out_features, in_features = weight.shape
    return weight.detach().reshape(out_features // LANES, LANES, in_features).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x [rows, in]`` and ``packed = pack(weight)``: ``[rows, out]``."""
    return _linear(_lib(), x, packed, bias)


def _linear(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows, in_features = x.shape
    if packed.dim() != 3 or packed.shape[1] != in_features or packed.shape[2] != LANES:
        raise ValueError(f"x [{rows}, {in_features}] does not fit a packed weight of shape {tuple(packed.shape)}")
    if x.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        raise ValueError(f"the kernel takes float32 inputs, got x {x.dtype}, bias {None if bias is None else bias.dtype}")
    x = x.contiguous()
    out_features = packed.shape[0] * LANES
    y = torch.empty((rows, out_features), dtype=torch.float32)
    bias = None if bias is None else bias.contiguous()  # kept alive through the call
    bias_ptr = None if bias is None else bias.data_ptr()
    lib.ludic_decode_gemm(
        x.data_ptr(), rows, in_features, packed.data_ptr(), out_features, bias_ptr, y.data_ptr(), torch.get_num_threads()
    )
    return y
