"""Shard a Hugging Face causal LM with PyTorch's FSDP2 (``fully_shard``): one unit per decoder layer
plus the root (embeddings, final norm, LM head).

Launch with ``torchrun --nproc_per_node=N`` and call :func:`init_distributed` first; then
``shard_model(model, FSDPConfig(...))`` before building the Trainer (the optimizer must see the
sharded parameters). Only PyTorch's own engine is used: ``torch.distributed`` process groups,
``fully_shard``, ``MixedPrecisionPolicy`` and ``CPUOffloadPolicy`` (torch 2.11-2.14).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

from ludic.timeouts import Timeouts
from ludic.training.parallel.collective_timeout import named_collective, set_collective_bound

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
           "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}  # fmt: skip


@dataclass
class FSDPConfig:
    """How :func:`shard_model` shards.

    param_dtype: dtype of the gathered parameters in forward/backward ("bf16", "fp32", None = as stored).
        The sharded master weights and the optimizer state stay in the model's own dtype.
    reduce_dtype: dtype gradients are reduce-scattered in (None = ``param_dtype``).
    cpu_offload: keep sharded parameters, gradients and optimizer state in host memory.
    activation_checkpointing: recompute each decoder layer's activations in backward.
    reshard_after_forward: free gathered layer weights after forward (ZeRO-3); False keeps them (ZeRO-2).
    """

    param_dtype: str | None = None
    reduce_dtype: str | None = None
    cpu_offload: bool = False
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value is not None and value not in _DTYPES:
                raise ValueError(f"FSDPConfig.{name} must be None or one of {sorted(_DTYPES)}, got {value!r}")


def init_distributed(backend: str | None = None, *, timeout_s: float = Timeouts.collective_s) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment; returns ``(rank, world_size)``.

    backend: "nccl" when CUDA is available, else "gloo" (None picks). Already initialised: no-op.
    timeout_s (``[timeouts].collective_s``): how long the rendezvous and every collective and barrier wait for
    the other ranks (gloo and NCCL honour it); ``collective_timeout.named_collective`` names what timed out.
    """
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed support")
    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(
                f"init_distributed needs torchrun's environment ({', '.join(missing)} unset); launch with "
                "`torchrun --nproc_per_node=N your_script.py`"
            )
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        set_collective_bound(timeout_s)
    return dist.get_rank(), dist.get_world_size()


def shutdown_distributed() -> None:
    """Wait for every rank, then destroy the process groups (no-op when none is initialised).

    Why the barrier: a rank that tears its group down while a peer is still busy (rank 0 writing files,
    a publish in flight) closes connections under that peer; with gloo that can end in an abort at exit
    instead of a clean return code.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    with named_collective("barrier at shutdown"):
        dist.barrier()
    dist.destroy_process_group()


def exit_distributed(code: int = 0) -> NoReturn:
    """``shutdown_distributed()``, then end the process at once, without interpreter finalization.

    Why: with gloo, a rank whose work is all done (files written, groups destroyed) can still abort while
    the interpreter finalizes: SIGABRT, "terminate called without an active exception", with no Python
    frame left on the stack. The process group's C++ threads outlive Python (pytorch/pytorch#179291
    describes the mechanism), and torchrun then reports the finished run as failed. Flushing stdio and
    logging and leaving with ``os._exit`` skips that finalization. Call it last in a torchrun script:
    ``atexit`` handlers do not run after it.
    """
    shutdown_distributed()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def is_fsdp_model(model: nn.Module) -> bool:
    """True when ``model`` (the root) was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a HF causal LM (peft-wrapped or not).

    Found as the ``nn.ModuleList`` with the most parameters, so Qwen2/Llama (``model.layers``),
    GPT-2 (``transformer.h``) and peft wrappers around them all work.
    """
    best: nn.ModuleList | None = None
    best_size = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = module, size
    if best is None:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of decoder layers to shard")
    return list(best)


def _enable_activation_checkpointing(model: nn.Module) -> None:
    """HF's per-layer (non-reentrant) activation checkpointing, which composes with ``fully_shard``."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(
            f"FSDPConfig.activation_checkpointing=True but {type(model).__name__} has no "
            "gradient_checkpointing_enable(); use a transformers model"
        )
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False


def _policies(cfg: FSDPConfig) -> dict:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict = {"reshard_after_forward": cfg.reshard_after_forward}
    if cfg.param_dtype is not None or cfg.reduce_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=_DTYPES[cfg.param_dtype] if cfg.param_dtype else None,
            reduce_dtype=_DTYPES[cfg.reduce_dtype] if cfg.reduce_dtype else None,
        )
    if cfg.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def shard_model(model: nn.Module, cfg: FSDPConfig | None = None, *, mesh=None) -> nn.Module:
    """Apply ``fully_shard`` to every decoder layer, then to the root; returns ``model`` (sharded in place).

    Needs an initialised process group. With CUDA the model should already be on this rank's device
    (or on the meta device); with ``cpu_offload`` it stays on the CPU.
    """
    from torch.distributed.fsdp import fully_shard

    cfg = cfg or FSDPConfig()
    if not dist.is_initialized():
        raise RuntimeError("shard_model needs torch.distributed initialised; call init_distributed() first")
    if is_fsdp_model(model):
        raise ValueError(f"{type(model).__name__} is already sharded; call shard_model once")
    if cfg.activation_checkpointing:
        _enable_activation_checkpointing(model)
    kwargs = _policies(cfg)
    if mesh is not None:
        kwargs["mesh"] = mesh
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
