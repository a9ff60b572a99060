"""One switch for the CPU speed-ups: ``cpu_kernels`` = ``"auto"`` (default), ``"on"`` or ``"off"``.

``select(device, setting)`` says which kernels of ``ludic.kernels.cpu`` run for tensors on ``device``;
the Trainer (``TrainerConfig.cpu_kernels``), the frozen-model scorer and the embedded engine
(``TransformersChatClient(cpu_kernels=...)``) all ask it. A setting left at None is read from the
environment variable ``LUDIC_CPU_KERNELS`` (default ``"auto"``), so one value set there switches
every component of a process.

- ``"auto"``: on a CPU device every kernel whose private PyTorch ops this torch has and runs
  correctly (``private_ops.works``, probed once per process; a missing op is logged once and only
  the kernels needing it fall back), and Ludic's own compiled kernels (``BUILT``) where this machine
  builds and runs them; on any other device none: plain PyTorch / transformers.
- ``"on"``: as ``"auto"``, but a missing op (or a kernel that cannot be built here) is an error instead of a
  fallback (benchmarks, tests).
- ``"off"``: none, on every device.

The per-feature settings (``TrainerConfig.onednn_linears``, ``TrainerConfig.block_attention``,
``BatchGenerator(lean=, share_prefix=)``) stay as overrides that can only turn one kernel off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Literal

import torch

from ludic.kernels.cpu import decode_attention, decode_gemm, decode_layers, rms_norm, swiglu
from ludic.kernels.private_ops import (
    FLASH_ATTENTION_CPU,
    LINEAR_BACKWARD_WEIGHTS,
    LINEAR_POINTWISE,
    REORDER_LINEAR_WEIGHT,
    works,
)

CpuKernels = Literal["auto", "on", "off"]
SETTINGS: tuple[str, ...] = ("auto", "on", "off")
CPU_KERNELS_ENV = "LUDIC_CPU_KERNELS"


@dataclass(frozen=True)
class KernelChoice:
    """Which CPU kernels run (all False: the plain PyTorch / transformers path).

    onednn_linear: training linears, forward and backward, on oneDNN (``cpu/onednn_linear.py``).
    segment_attention: packed rows' attention by blocks with bucketed SDPA (``cpu/segment_attention.py``);
        off, packed CPU rows use the dense 4D mask.
    lean_decoder: the embedded engine decodes through ``cpu/lean_decoder.py``; off, through the model's forward.
    packed_linear: the lean decoder's matmuls on oneDNN's packed weights; off, ``F.linear``.
    shared_prefix_cache: rows sharing a prompt read its K/V once (``cpu/shared_prefix_cache.py``).
    recompute_layers: training's gated MLPs and RMSNorms keep less for the backward and recompute their
        elementwise parts there (``cpu/recompute.py``); off, autograd keeps what the layers' own ops save.
    decode_gemm: the lean decoder's matmuls through Ludic's own AVX-512 or AVX2 kernel (``cpu/decode_gemm.py``,
        compiled at first use); off (or where it cannot be built), oneDNN's packed matmuls (``packed_linear``).
    decode_attention: the shared-prefix cache's attention in one call of Ludic's own kernel a layer
        (``cpu/decode_attention.py``, compiled with ``decode_gemm``); off, two SDPA calls and their merge.
    decode_layers: the lean decoder's step runs every layer in one call of Ludic's own kernel
        (``cpu/decode_layers.py``, compiled with ``decode_gemm``; its matmuls and attention are those two kernels',
        its norms, RoPE and gated SiLU its own) where the layers and the cache are of the kinds it takes; off, the
        decoder's Python loop over the layers.
    tied_embedding_grad: training adds a tied input embedding's gradient into the weight's ``.grad`` row by
        row (``cpu/tied_embedding.py``); off, autograd builds it as a dense vocabulary-sized tensor.
    swiglu: ``recompute_layers``' gated MLPs run their elementwise part (SiLU, the gating product and their
        backward) in one pass of Ludic's own kernel (``cpu/swiglu.py``, compiled with ``decode_gemm``); off,
        PyTorch's ops (two passes forward, five backward).
    rms_norm: ``recompute_layers``' RMSNorms in one pass of Ludic's own kernel each way (``cpu/rms_norm.py``);
        off, PyTorch's ops.
    """

    onednn_linear: bool = False
    segment_attention: bool = False
    lean_decoder: bool = False
    packed_linear: bool = False
    shared_prefix_cache: bool = False
    recompute_layers: bool = False
    decode_gemm: bool = False
    decode_attention: bool = False
    decode_layers: bool = False
    tied_embedding_grad: bool = False
    swiglu: bool = False
    rms_norm: bool = False


NEEDS: dict[str, tuple[str, ...]] = {
    "onednn_linear": (LINEAR_POINTWISE, LINEAR_BACKWARD_WEIGHTS),
    "segment_attention": (),
    "lean_decoder": (),
    "packed_linear": (LINEAR_POINTWISE, REORDER_LINEAR_WEIGHT),
    "shared_prefix_cache": (FLASH_ATTENTION_CPU,),
    "recompute_layers": (),
    "decode_gemm": (),
    "decode_attention": (),
    "decode_layers": (),
    "tied_embedding_grad": (),
    "swiglu": (),
    "rms_norm": (),
}
"""The private ops each kernel calls (``private_ops``); the others are plain PyTorch ops."""
BUILT = {
    "decode_gemm": decode_gemm, "decode_attention": decode_attention, "decode_layers": decode_layers, "swiglu": swiglu,
    "rms_norm": rms_norm,
}  # fmt: skip
"""Kernels of Ludic's own, compiled on this machine: each needs its module's ``available()`` as well."""


def cpu_kernels_setting(setting: str | None = None) -> CpuKernels:
    """``setting``, or ``$LUDIC_CPU_KERNELS`` (default ``"auto"``) when None; checked."""
    value = os.environ.get(CPU_KERNELS_ENV, "auto") if setting is None else setting
    if value not in SETTINGS:
        source = f" (from ${CPU_KERNELS_ENV})" if setting is None else ""
        raise ValueError(f"cpu_kernels must be one of {SETTINGS}, got {value!r}{source}")
    return value  # type: ignore[return-value]


def select(device: torch.device | str, setting: str | None = None) -> KernelChoice:
    """The CPU kernels that run for tensors on ``device`` under ``setting`` (see the module docstring)."""
    value = cpu_kernels_setting(setting)
    if value == "off" or torch.device(device).type != "cpu":
        return KernelChoice()
    chosen: dict[str, bool] = {}
    for kernel in (f.name for f in fields(KernelChoice)):
        missing = [op for op in NEEDS[kernel] if not works(op)]
        if missing and value == "on":
            raise RuntimeError(
                f"cpu_kernels='on' but torch {torch.__version__} cannot run {', '.join(missing)} "
                f"(needed by the {kernel} kernel); use cpu_kernels='auto' to fall back to the plain path"
            )
        built = BUILT.get(kernel)
        if built is not None and not missing and not built.available():
            if value == "on":
                raise RuntimeError(
                    f"cpu_kernels='on' but the {kernel} kernel cannot run here: {built.unavailable_reason()}; "
                    "use cpu_kernels='auto' to fall back"
                )
            missing = [kernel]
        chosen[kernel] = not missing
    return KernelChoice(**chosen)
