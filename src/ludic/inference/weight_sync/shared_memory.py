"""Weight transfer through shared memory, for a trainer and a server on one host: one copy, no socket.

Ludic's own data plane (vLLM's nearest is its CUDA-IPC backend for a trainer on the inference GPU). The
server's receive buffers are anonymous shared-memory files (``memfd_create``); for each ``update_info``
it reserves one and names it by ``(pid, fd)``, the trainer maps ``/proc/<pid>/fd/<fd>`` and packs the
tensors straight into it, and the server copies the bytes out into its own private memory at once and
checks and adopts that copy, as it does with broadcast buffers. The trainer's mapping stays writable, so a
shared buffer is never live weights: a later write through it (a bug, or a second publisher) changes
nothing served. Sealing cannot replace the copy: ``F_SEAL_WRITE`` is refused while any writable mapping
exists, and sealed buffers could never be reused.

Who can use it: the kernel lets a process open another's ``/proc/<pid>/fd`` only with ptrace read
access (same user, or CAP_SYS_PTRACE), so only a trainer that could already read the server's memory
can map its buffers; and the routes that hand out a buffer take the server's bearer token like every
other weight route. The trainer, for its part, opens only what is provably the server's buffer
(``map_peer_buffer``): a reply naming ``(pid, fd)`` could otherwise make it write into any file that
process has open. Nothing is left behind if either process dies: a memfd lives only as long as some
process holds it open or mapped.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import stat
from dataclasses import dataclass, field

import torch

SHARED_MEMORY_BACKEND = "shm"
"""The ``init_info.backend`` value that selects this data plane (absent: vLLM's NCCL-style init_info)."""
NAME_PREFIX = "ludic-weights-"
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL  # fixed size: no SIGBUS by truncation


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
    fd = os.memfd_create(f"{NAME_PREFIX}{buffer_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        tensor = torch.frombuffer(
            mmap.mmap(fd, nbytes), dtype=torch.uint8
        )  # the tensor keeps the mapping alive
    except BaseException:
        os.close(fd)
        raise
    return SharedBuffer(buffer_id, fd, nbytes, tensor)


@dataclass
class SharedPool:
    """The server's shared buffers by id: staging the trainer writes into, never the model's storage."""

    buffers: dict[int, SharedBuffer] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)  # handed out since the last ``prune``
    last_id: int = 0

    def take(self, size: int, busy: set[int]) -> tuple[SharedBuffer, bool]:
        """The smallest buffer of at least ``size`` bytes not in ``busy``, else a new one; (buffer, whether new)."""
        free = [b for b in self.buffers.values() if b.nbytes >= size and b.buffer_id not in busy]
        fresh = not free
        if fresh:
            self.last_id += 1
            buffer = self.buffers[self.last_id] = allocate_shared(size, self.last_id)
        else:
            buffer = min(free, key=lambda b: b.nbytes)
        self.used.add(buffer.buffer_id)
        return buffer, fresh

    def retire(self, ids: set[int]) -> None:
        """Close buffers a publisher that was taken over may still write into: never handed out again."""
        for buffer_id in ids & set(self.buffers):
            self.buffers.pop(buffer_id).close()

    def prune(self) -> None:
        """Keep the buffers used since the last prune (the next update reuses them), close the rest."""
        self.retire(set(self.buffers) - self.used)
        self.used = set()


def map_peer_buffer(pid: int, fd: int, nbytes: int) -> torch.Tensor:
    """The server's buffer ``fd`` of process ``pid``, mapped here (trainer side) as a writable uint8 tensor;
    only when it is one: an unlinked regular file named ``memfd:ludic-weights-N`` of exactly ``nbytes``
    bytes, sealed against resizing. Anything else (a file on disk, a device, a pipe) is refused unopened
    or, checked again on the opened descriptor (no swap in between), unmapped."""
    path = f"/proc/{int(pid)}/fd/{int(fd)}"
    try:
        _check_buffer(path, os.stat(path), os.readlink(path), nbytes)
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise RuntimeError(
            f"cannot open the server's shared weight buffer {path} ({exc.strerror}): the 'shm' backend needs "
            "the trainer and the server on one host, in one PID namespace, under one user; use 'gloo' otherwise"
        ) from exc
    try:
        _check_buffer(path, os.fstat(own), os.readlink(f"/proc/self/fd/{own}"), nbytes)
        if fcntl.fcntl(own, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise RuntimeError(f"{path} is not sealed against resizing: not a buffer of Ludic's server")
        return torch.frombuffer(mmap.mmap(own, nbytes), dtype=torch.uint8)
    finally:
        os.close(own)  # the mapping keeps its own reference to the file


def _check_buffer(path: str, info: os.stat_result, target: str, nbytes: int) -> None:
    if not target.startswith(f"/memfd:{NAME_PREFIX}") or not stat.S_ISREG(info.st_mode) or info.st_nlink != 0:
        raise RuntimeError(f"{path} is {target!r}, not a weight buffer of Ludic's server (memfd:{NAME_PREFIX}N): refused")
    if info.st_size != nbytes:
        raise RuntimeError(f"the server's shared weight buffer {path} has {info.st_size} bytes, it announced {nbytes}")


def listening_sockets(port: int) -> set[str]:
    """``socket:[inode]`` of every TCP socket listening on ``port`` in this network namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for fields in (line.split() for line in lines):  # sl local remote state ... uid timeout inode
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found


def check_serves_port(pid: int, port: int) -> None:
    """RuntimeError unless process ``pid`` holds the socket listening on ``port``: the server the trainer
    talks to, so a reply cannot name another process's buffers."""
    sockets = listening_sockets(port)
    try:
        fds = os.listdir(f"/proc/{int(pid)}/fd")
    except OSError as exc:
        raise RuntimeError(f"cannot read process {pid}'s descriptors ({exc.strerror}): the 'shm' backend needs "
                           "the trainer and the server on one host, under one user") from exc  # fmt: skip
    held = set()
    for fd in fds:
        with contextlib.suppress(OSError):  # closed since the listing
            held.add(os.readlink(f"/proc/{int(pid)}/fd/{fd}"))
    if not sockets & held:
        raise RuntimeError(f"process {pid} does not listen on port {port}, where the server answers: its "
                           "buffers are refused (the reply named another process)")  # fmt: skip
