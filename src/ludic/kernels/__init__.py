"""Hand-tuned kernels: speed-ups behind the plain PyTorch / transformers path, chosen by one switch.

``select(device, cpu_kernels)`` (``switch.py``) says which of ``ludic.kernels.cpu`` run; the private
PyTorch ops they call are probed once per process (``private_ops.py``) and a missing one sends its
kernels back to the plain path. This package imports nothing from training, inference or distributed.
"""

from ludic.kernels.switch import CPU_KERNELS_ENV, CpuKernels, KernelChoice, cpu_kernels_setting, select

__all__ = ["CPU_KERNELS_ENV", "CpuKernels", "KernelChoice", "cpu_kernels_setting", "select"]
