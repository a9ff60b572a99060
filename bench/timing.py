"""Wall-clock timing shared by the benchmarks: a CUDA device is synchronised before and after."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds ``fn()`` takes; on CUDA, queued kernels finish before the clock starts and before it stops."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0
