"""A standalone two-sided process group for weight transfer (not torch.distributed's default group).

The trainer is rank 0 and hosts the rendezvous store; inference ranks join at ``rank_offset``.
Gloo on CPU (bound to ``address``, so loopback stays loopback), NCCL on GPU. Being standalone, it
neither needs nor disturbs a training job's own ``init_process_group`` (FSDP).

Channels (gloo only): a gloo group with ``channels`` devices holds that many TCP connections per peer,
each with its own I/O thread, and gloo assigns each collective to one of them in turn. ``broadcast_all``
then splits every large tensor into ``channels`` contiguous parts and issues all parts at once (each a
broadcast of its own, run on the group's worker threads), so one tensor travels over every connection
in parallel. Both ends must use the same channel count: they must issue the same broadcasts, of the
same sizes, in the same order (``parts`` decides the split from the size alone).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

MAX_CHANNELS = 16
SPLIT_BYTES = 1 << 20  # a tensor is split across the channels once each part would be at least this


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (for the rendezvous store)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_channels(channels: int, backend: str) -> int:
    if not isinstance(channels, int) or not 1 <= channels <= MAX_CHANNELS:
        raise ValueError(f"channels must be an int from 1 to {MAX_CHANNELS}, got {channels!r}")
    if backend == "nccl" and channels != 1:
        raise ValueError("channels > 1 is for gloo (NCCL spreads one broadcast over its own channels)")
    return channels


def create_group(
    address: str, port: int, rank: int, world_size: int, *, backend: str, timeout_s: float, channels: int = 1
) -> Any:
    """Rendezvous at ``address:port`` and return the process group (blocks until all ranks joined)."""
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    check_channels(channels, backend)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address) for _ in range(channels)]
    opts._threads = 2 * channels  # two broadcasts in flight per channel
    return dist.ProcessGroupGloo(store, rank, world_size, opts)


def parts(tensor: torch.Tensor, channels: int) -> list[torch.Tensor]:
    """``tensor`` (contiguous) as the pieces broadcast one per call: itself, or ``channels`` byte ranges
    of it (views, so a receive lands in place) once each would be at least ``SPLIT_BYTES``."""
    nbytes = tensor.numel() * tensor.element_size()
    if channels == 1 or nbytes < channels * SPLIT_BYTES:
        return [tensor]
    return list(tensor.reshape(-1).view(torch.uint8).tensor_split(channels))


def broadcast(group: Any, tensor: Any, *, timeout_s: float) -> None:
    """Broadcast ``tensor`` from rank 0 (in place on the others); raises when a peer does not show up in time."""
    group.broadcast(tensor, 0, timedelta(seconds=timeout_s)).wait()


def broadcast_all(group: Any, tensors: Sequence[torch.Tensor], *, timeout_s: float, channels: int = 1) -> None:
    """Broadcast each of ``tensors`` from rank 0, every part of every tensor issued at once and then all
    waited for (each wait raises on its own timeout): the group's worker threads keep two broadcasts in
    flight per channel, so neither side waits for a thread hand-off between one tensor and the next."""
    timeout = timedelta(seconds=timeout_s)
    works = [group.broadcast(p, 0, timeout) for t in tensors for p in parts(t, channels)]
    for work in works:
        work.wait()
