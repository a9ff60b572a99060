"""Weight transfer through shared memory, for a trainer and a server on one host: one copy, no socket.

Ludic's own data plane (vLLM's nearest is its CUDA-IPC backend for a trainer on the inference GPU). The
server's receive buffers are anonymous shared-memory files (``memfd_create``); for each ``update_info``
it reserves one and names it by ``(pid, fd)``, the trainer maps ``/proc/<pid>/fd/<fd>`` and packs the
tensors straight into it, and the server then checks the bytes and adopts them as the model's storage,
as it does with broadcast buffers. A broadcast copies every byte twice (into the kernel and out of it,
two processes on the same cores); this copies it once.

Who can use it: the kernel lets a process open another's ``/proc/<pid>/fd`` only with ptrace read
access (same user, or CAP_SYS_PTRACE), so only a trainer that could already read the server's memory
can map its buffers; and the routes that hand out a buffer take the server's bearer token like every
other weight route. A mapping stays writable in the trainer, which is trusted with the weights anyway:
the server only ever hands out a buffer the model is not using, and the trainer writes only into the
buffer it was handed for the current call. Nothing is left behind if either process dies: a memfd lives
only as long as some process holds it open or mapped.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import torch

SHARED_MEMORY_BACKEND = "shm"
"""The ``init_info.backend`` value that selects this data plane (absent: vLLM's NCCL-style init_info)."""


@dataclass(frozen=True)
class SharedBuffer:
    """One of the server's receive buffers: a memfd of ``nbytes`` mapped as a uint8 tensor."""

    buffer_id: int
    fd: int
    nbytes: int
    tensor: torch.Tensor

    def close(self) -> None:
        """Close the file descriptor; the memory lives on while the tensor (or a view of it) does."""
        os.close(self.fd)


def allocate_shared(nbytes: int, buffer_id: int) -> SharedBuffer:
    """A fresh shared buffer of ``nbytes`` (at least 1: a mapping cannot be empty)."""
    if not hasattr(os, "memfd_create"):
        raise RuntimeError("the shared-memory weight transfer needs Linux (os.memfd_create)")
    nbytes = max(nbytes, 1)
    fd = os.memfd_create(f"ludic-weights-{buffer_id}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        tensor = torch.frombuffer(
            mmap.mmap(fd, nbytes), dtype=torch.uint8
        )  # the tensor keeps the mapping alive
    except BaseException:
        os.close(fd)
        raise
    return SharedBuffer(buffer_id, fd, nbytes, tensor)


def map_peer_buffer(pid: int, fd: int, nbytes: int) -> torch.Tensor:
    """The server's buffer ``fd`` of process ``pid``, mapped here (trainer side) as a writable uint8 tensor."""
    path = f"/proc/{int(pid)}/fd/{int(fd)}"
    try:
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise RuntimeError(
            f"cannot open the server's shared weight buffer {path} ({exc.strerror}): the 'shm' backend needs "
            "the trainer and the server on one host, in one PID namespace, under one user; use 'gloo' otherwise"
        ) from exc
    try:
        size = os.fstat(own).st_size
        if size != nbytes:
            raise RuntimeError(
                f"the server's shared weight buffer {path} has {size} bytes, it announced {nbytes}"
            )
        return torch.frombuffer(mmap.mmap(own, nbytes), dtype=torch.uint8)
    finally:
        os.close(own)  # the mapping keeps its own reference to the file
