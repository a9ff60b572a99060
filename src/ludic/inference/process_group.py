"""A standalone two-sided process group for weight transfer (not torch.distributed's default group).

The trainer is rank 0 and hosts the rendezvous store; inference ranks join at ``rank_offset``.
Gloo on CPU (bound to ``address``, so loopback stays loopback), NCCL on GPU. Being standalone, it
neither needs nor disturbs a training job's own ``init_process_group`` (FSDP).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for the rendezvous store)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def create_group(
    address: str, port: int, rank: int, world_size: int, *, backend: str, timeout_s: float
) -> Any:
    """Rendezvous at ``address:port`` and return the process group (blocks until all ranks joined)."""
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(store, rank, world_size, opts)


def broadcast(group: Any, tensor: Any, *, timeout_s: float) -> None:
    """Broadcast ``tensor`` from rank 0 (in place on the others); raises when a peer does not show up in time."""
    group.broadcast(tensor, 0, timedelta(seconds=timeout_s)).wait()
