"""The sandbox's seccomp filter: a classic-BPF program built here with ``struct`` and handed to bwrap
(``--seccomp FD``), which loads it (with no_new_privs) just before it runs the program.

Denied calls return an error (EPERM; ENOSYS for ``clone3``, whose flags live in memory a filter
cannot read, so that libc falls back to ``clone``, whose flags it can) instead of killing the
program, so a program that tries them gets a clean ``PermissionError``. Denied: new namespaces
(nested user namespaces gave full capabilities and a working ``mount()``), mounting, io_uring,
the kernel keyring, ptrace and reading other processes' memory, bpf/perf, module and kexec
loading, and every socket family but AF_UNIX/AF_INET/AF_INET6 (AF_VSOCK is not isolated by the
network namespace). A call from another ABI (x32, or 32-bit ``int 0x80`` on x86_64) is denied
whole, since its numbers differ.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import socket
import struct
from dataclasses import dataclass

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# offsets in struct seccomp_data: nr, arch, then args[i] as u64 (low half first on little endian)
OFF_NR, OFF_ARCH, OFF_ARG0_LO = 0, 4, 16

CLONE_NS_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (clone's low byte is the exit signal)."""
ALLOWED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)

DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "add_key", "request_key", "keyctl", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "bpf",
    "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "open_by_handle_at", "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl",
)  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """One ABI: its AUDIT_ARCH value, syscall numbers, and where another ABI's numbers start."""

    audit: int
    numbers: dict[str, int]
    foreign_from: int | None = None


_GENERIC_IO_URING = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "clone3": 435}
_GENERIC_NEW = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
                "fspick": 433, "pidfd_getfd": 438, "mount_setattr": 442}  # fmt: skip
_BY_ABI = {  # name: (x86_64, aarch64) numbers of the calls that differ between the two ABIs
    "socket": (41, 198), "socketpair": (53, 199), "clone": (56, 220), "unshare": (272, 97),
    "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "ptrace": (101, 117), "add_key": (248, 217), "request_key": (249, 218),
    "keyctl": (250, 219), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "quotactl": (179, 60),
}  # fmt: skip
_X86_64 = {name: nums[0] for name, nums in _BY_ABI.items()}
_AARCH64 = {name: nums[1] for name, nums in _BY_ABI.items()}
ARCHES = {  # numbers from the kernel's uapi headers (asm/unistd_64.h; asm-generic/unistd.h for arm64)
    "x86_64": Arch(audit=0xC000003E, numbers={**_X86_64, **_GENERIC_IO_URING, **_GENERIC_NEW}, foreign_from=0x40000000),
    "aarch64": Arch(audit=0xC00000B7, numbers={**_AARCH64, **_GENERIC_IO_URING, **_GENERIC_NEW}),
}
"""``foreign_from``: x86_64's __X32_SYSCALL_BIT (x32 calls have numbers of their own)."""


class SeccompUnsupportedError(RuntimeError):
    """No syscall table for this machine's architecture."""


def native_arch() -> Arch:
    machine = platform.machine()
    if machine not in ARCHES:
        raise SeccompUnsupportedError(
            f"no seccomp syscall table for architecture {machine!r} (have {sorted(ARCHES)}); the sandbox "
            "cannot deny nested user namespaces, mount, io_uring, ptrace or AF_VSOCK sockets here"
        )
    return ARCHES[machine]


def build_filter(arch: Arch | None = None) -> bytes:
    """The filter as bwrap reads it: an array of ``struct sock_filter`` (u16 code, u8 jt, u8 jf, u32 k)."""
    arch = arch or native_arch()
    prog: list[tuple[int, int, str | None, str | None]] = []  # (code, k, jump-if-true label, if-false label)
    labels: dict[str, int] = {}

    def emit(code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        prog.append((code, k, jt, jf))

    emit(LD_W_ABS, OFF_ARCH)
    emit(JEQ_K, arch.audit, None, "deny")  # another ABI: its numbers mean other calls
    emit(LD_W_ABS, OFF_NR)
    if arch.foreign_from is not None:
        emit(JGE_K, arch.foreign_from, "deny")
    for nr in sorted({arch.numbers[name] for name in DENIED}):
        emit(JEQ_K, nr, "deny")
    emit(JEQ_K, arch.numbers["clone3"], "enosys")
    emit(JEQ_K, arch.numbers["clone"], "clone")
    emit(JEQ_K, arch.numbers["socket"], "socket")
    emit(JEQ_K, arch.numbers["socketpair"], "socket")
    emit(RET_K, RET_ALLOW)
    labels["clone"] = len(prog)
    emit(LD_W_ABS, OFF_ARG0_LO)
    emit(JSET_K, CLONE_NS_FLAGS, "deny", "allow")
    labels["socket"] = len(prog)
    emit(LD_W_ABS, OFF_ARG0_LO)
    for family in ALLOWED_FAMILIES:
        emit(JEQ_K, family, "allow")
    labels["deny"] = len(prog)
    emit(RET_K, RET_ERRNO | errno.EPERM)
    labels["enosys"] = len(prog)
    emit(RET_K, RET_ERRNO | errno.ENOSYS)
    labels["allow"] = len(prog)
    emit(RET_K, RET_ALLOW)
    return b"".join(struct.pack("=HBBI", code, _jump(labels, jt, i), _jump(labels, jf, i), k)
                    for i, (code, k, jt, jf) in enumerate(prog))  # fmt: skip


@functools.cache
def native_filter() -> bytes:
    """``build_filter()`` for this machine, built once per process (every runner shares the bytes)."""
    return build_filter()


def _jump(labels: dict[str, int], label: str | None, at: int) -> int:
    """BPF jumps are forward offsets (0-255) from the next instruction."""
    if label is None:
        return 0
    offset = labels[label] - at - 1
    assert 0 <= offset < 256, (label, offset)
    return offset


def filter_fd(program: bytes) -> int:
    """A readable fd holding ``program`` (a pipe: bwrap reads to EOF). The caller closes it."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # well under a pipe's buffer (~70 instructions x 8 bytes)
    finally:
        os.close(write_end)
    return read_end
