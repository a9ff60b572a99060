"""What the sandbox's first process does between fork and exec (a ``preexec_fn``): join the run's
cgroup, mount the run's bounded scratch tmpfs in a private mount namespace, drop to the run's
user id, set the rlimits.

The scratch space: bwrap's ``--tmpfs`` takes a size but no inode limit (175k empty files took
0 KiB of a 16 MiB /tmp), so the tmpfs is mounted here with ``size=`` and ``nr_inodes=``, in a mount
namespace of this process alone (as root; without root in a user namespace of its own first), and
bwrap binds it at ``/tmp`` and ``/dev/shm``. Nothing is mounted on the host; the tmpfs goes with
the run's last process.
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ChildSetup:
    """Everything the child applies to itself before exec (all values computed in the parent)."""

    cpu_s: int
    memory_bytes: int | None
    """RLIMIT_AS; None where the run's cgroup bounds memory (address space reservations are then free)."""
    max_processes: int | None
    """RLIMIT_NPROC; None where it cannot be tight (the caller's uid runs other processes)."""
    max_open_files: int
    max_file_bytes: int
    cgroup_join: tuple[str, ...] = ()
    """Files to write ``0`` (this process) to, joining the run's cgroup (``RunGroup.join_files``)."""
    scratch_dir: str | None = None
    """Mount the bounded tmpfs here (a host directory, covered only in the child's namespace)."""
    scratch_bytes: int = 0
    scratch_inodes: int = 0
    user: int | None = None
    """Drop to this uid and gid (the root path); None keeps the caller's."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount_scratch(setup: ChildSetup) -> None:
    assert setup.scratch_dir is not None
    if os.geteuid() != 0:  # a user namespace of our own gives us the right to mount in a new mount ns
        uid, gid = os.getuid(), os.getgid()
        _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        owner = uid
    else:
        _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        owner = setup.user if setup.user is not None else 0
    _check(_libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    options = f"size={setup.scratch_bytes},nr_inodes={setup.scratch_inodes},mode=0700,uid={owner},gid={owner}"
    _check(
        _libc.mount(b"tmpfs", setup.scratch_dir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()),
        f"mount tmpfs on {setup.scratch_dir}",
    )


def child_preexec(setup: ChildSetup) -> Callable[[], None]:
    """The ``preexec_fn`` for ``setup`` (runs in the forked child, before exec)."""

    def apply() -> None:
        os.setsid()
        for path in setup.cgroup_join:
            _write(path, "0")
        if setup.scratch_dir is not None:
            _mount_scratch(setup)
        if setup.user is not None:
            os.setgroups([])
            os.setgid(setup.user)
            os.setuid(setup.user)
        limit = resource.setrlimit
        limit(resource.RLIMIT_CPU, (setup.cpu_s, setup.cpu_s + 1))
        if setup.memory_bytes is not None:
            limit(resource.RLIMIT_AS, (setup.memory_bytes, setup.memory_bytes))
        limit(resource.RLIMIT_NOFILE, (setup.max_open_files, setup.max_open_files))
        limit(resource.RLIMIT_FSIZE, (setup.max_file_bytes, setup.max_file_bytes))
        limit(resource.RLIMIT_CORE, (0, 0))
        if setup.max_processes is not None:
            limit(resource.RLIMIT_NPROC, (setup.max_processes, setup.max_processes))

    return apply
