"""Sandbox user ids and the processes that run under them: claiming a uid no other run holds (a lock
file per uid in a directory only we can write), and killing what a run left.

The lock directory is created owned by us with mode 0700 and is refused when it is anything else
(a symlink, or a directory another local user created first: the trainer, as root, would otherwise
create its lock files wherever that user points it). Lock files are opened relative to it with
O_NOFOLLOW.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

UID_SPAN = 4096
"""Sandbox uids are ``base_uid .. base_uid + UID_SPAN - 1``."""


class UnsafeLockDirError(RuntimeError):
    """The uid lock directory exists but is not a private directory of ours."""


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / "ludic-sandbox-uids"


def private_dir_fd(path: Path, mode: int = 0o700) -> int:
    """An fd of ``path``, a directory owned by us with at most ``mode``, created so if missing; raises
    UnsafeLockDirError (saying what is wrong) if it is a symlink, another user's, or open to others."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:  # ELOOP: a symlink; ENOTDIR: a file
        raise UnsafeLockDirError(f"{path} is not a plain directory ({exc.strerror}); remove it and retry") from None
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"it is owned by uid {info.st_uid}, not by us (uid {os.geteuid()})"
    elif stat.S_IMODE(info.st_mode) & ~mode:
        problem = f"its mode is {stat.S_IMODE(info.st_mode):04o}, more open than {mode:04o}"
    if problem is not None:
        os.close(fd)
        raise UnsafeLockDirError(f"refusing the sandbox directory {path}: {problem}; remove it and retry")
    return fd


@contextlib.contextmanager
def claimed_uid(base_uid: int, slot: int, lock_dir: Path | None = None) -> Iterator[int]:
    """An unprivileged uid no other run on this host holds (an flock per uid, so runs in other
    processes, e.g. two trainers or two test suites, never share one and never kill each other's)."""
    dir_fd = private_dir_fd(lock_dir or default_lock_dir())
    try:
        for k in range(UID_SPAN):
            uid = base_uid + (slot + k) % UID_SPAN
            fd = os.open(f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # releases the lock
            return
    finally:
        os.close(dir_fd)
    raise RuntimeError(f"all {UID_SPAN} sandbox uids from {base_uid} are in use")


def pids_of(uid: int) -> list[int]:
    """Host processes running under ``uid`` (their ``/proc`` entries; one that exits meanwhile is skipped)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def task_count(uid: int) -> int:
    """Tasks (threads) of ``uid``: what RLIMIT_NPROC counts."""
    count = 0
    for pid in pids_of(uid):
        with contextlib.suppress(OSError):
            count += len(os.listdir(f"/proc/{pid}/task"))
    return count


def children(pid: int) -> list[int]:
    """The children of ``pid`` (from /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


async def kill_sandbox_init(bwrap_pid: int, timeout_s: float = 2.0) -> None:
    """SIGKILL the sandbox's pid 1 (bwrap's child; the kernel then kills everything in its pid
    namespace) and give bwrap the moment to reap it. Killing bwrap first would orphan it to the
    host's init, which reaps it late (1.2-2 s here), or never where the trainer itself is pid 1 (a
    container without an init): a zombie of the run's uid then outlives the run."""
    for pid in children(bwrap_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while children(bwrap_pid) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.002)


async def kill_uid(uid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` until none is left (a fork bomb's children must not
    outlive the run)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pids := pids_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"sandbox processes of uid {uid} survived SIGKILL for {timeout_s}s: {pids}")
        await asyncio.sleep(0.005)
