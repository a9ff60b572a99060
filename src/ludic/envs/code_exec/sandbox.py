"""What a code runner is: limits in, one classified run out.

A runner executes one untrusted Python program on one stdin and reports how it ended. The
verdict on a test (compare outputs) is made by the caller, outside the untrusted process.
``BubblewrapRunner`` is the sandbox; ``UnsandboxedRunner`` exists for machines where
bubblewrap cannot run and must be chosen by name (``runner="unsandboxed"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from ludic.envs.code_exec.cgroup import RunGroup
from ludic.envs.code_exec.isolation import ChildSetup, child_preexec

RunStatus = Literal["ok", "runtime_error", "timeout", "memory_limit", "output_limit"]


class SandboxUnavailableError(RuntimeError):
    """Bubblewrap cannot run here; untrusted code is refused unless the user opts out by name."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits, enforced by the kernel (the run's cgroup, rlimits, the scratch tmpfs) or by the
    parent's watchdog. Where the machine gives no cgroup, memory/processes/CPU hold per process only."""

    wall_s: float = 5.0
    """Wall-clock seconds before the whole sandbox is killed (watchdog in the parent)."""
    cpu_s: int = 2
    """CPU seconds of the whole run (all its processes, read from its cgroup), and of each process
    (RLIMIT_CPU: a busy loop dies of SIGXCPU)."""
    memory_mb: int = 512
    """Memory of the whole run in MiB (its cgroup: past it the kernel OOM-kills, status memory_limit);
    without a cgroup, the address space of each process (RLIMIT_AS: MemoryError)."""
    max_processes: int = 16
    """Processes of the whole run (its cgroup's pids.max) and of its user id (RLIMIT_NPROC)."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 1 << 20
    """Bytes of stdout (and, separately, stderr) kept; more kills the run (status output_limit)."""
    tmp_size_mb: int = 16
    """Size of the run's only writable space (a tmpfs at /tmp, also at /dev/shm) and the largest file
    (RLIMIT_FSIZE)."""
    tmp_max_files: int = 4096
    """Inodes (files, directories, links) of that scratch space."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_processes", "max_open_files", "max_output_bytes",
                     "tmp_size_mb", "tmp_max_files"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RunOutcome:
    """How one run ended. ``stdout``/``stderr`` are cut at ``max_output_bytes``."""

    status: RunStatus
    returncode: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    uid: int | None = None
    """The user id the program ran as (None: the caller's own)."""
    cpu_s: float | None = None
    """CPU seconds of the whole run, from its cgroup (None: no cgroup)."""


@runtime_checkable
class CodeRunner(Protocol):
    """Runs ``/code/solution.py`` (from ``code_dir``) on ``stdin`` under ``limits`` as pool slot ``slot``."""

    name: str

    async def run(self, code_dir: Path, stdin: bytes, limits: SandboxLimits, *, slot: int) -> RunOutcome: ...


def plain_setup(limits: SandboxLimits, *, user: int | None = None, nproc: bool = True) -> ChildSetup:
    """The rlimits alone (no cgroup, no scratch mount): what a run without a sandbox gets."""
    return ChildSetup(
        cpu_s=limits.cpu_s,
        memory_bytes=limits.memory_mb << 20,
        max_processes=limits.max_processes if nproc else None,
        max_open_files=limits.max_open_files,
        max_file_bytes=limits.tmp_size_mb << 20,
        user=user,
    )


CPU_POLL_S = 0.1
"""How often the parent reads the run's CPU time from its cgroup (runs shorter than this: never)."""


async def run_limited(
    argv: list[str],
    stdin: bytes,
    limits: SandboxLimits,
    *,
    user: int | None = None,
    env: dict[str, str] | None,
    setup: ChildSetup | None = None,
    group: RunGroup | None = None,
    pass_fds: Collection[int] = (),
    kill_rest: Callable[[], Awaitable[None]] | None = None,
    kill_first: Callable[[int], Awaitable[None]] | None = None,
) -> RunOutcome:
    """Start ``argv`` in its own session with ``setup`` applied (default: the rlimits, as ``user``),
    feed stdin, collect capped output, kill the whole run on the wall limit, on too much output or
    when its cgroup's CPU time passes ``cpu_s``. ``kill_first(pid)`` runs before the kill of
    ``argv``'s process group (to stop what ``argv`` started in the right order, so nothing is
    orphaned); ``kill_rest`` after it. Output past the cap is read and dropped until the pipes
    close, so that the exit (reported only once every pipe is closed) can always be awaited. The
    status comes from what this parent observed (its timer, the cgroup's counters, the wait status
    of its own child), never from the program's output or exit code."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        preexec_fn=child_preexec(setup or plain_setup(limits, user=user)),
        pass_fds=tuple(pass_fds),
    )
    overflow = asyncio.Event()
    out, err = _Capped(limits.max_output_bytes, overflow), _Capped(limits.max_output_bytes, overflow)

    async def communicate() -> None:
        await asyncio.gather(_feed(proc, stdin), out.drain(proc.stdout), err.drain(proc.stderr))
        await proc.wait()

    finished = asyncio.ensure_future(communicate())
    status: RunStatus | None = None
    try:
        status = await _first_limit(finished, overflow, limits, group)
    finally:
        await _stop(proc.pid, finished, argv[0], group, kill_first, kill_rest)
    cpu_s = group.cpu_seconds() if group is not None else None
    oom_kills = group.oom_kills() if group is not None else 0
    if status is None or (status == "timeout" and oom_kills):  # an OOM kill says more than the timer after it
        status = classify(proc.returncode, oom_kills=oom_kills, cpu_s=cpu_s, limits=limits)
    return RunOutcome(status, proc.returncode, out.data(), err.data(), loop.time() - started, cpu_s=cpu_s)


async def _stop(pid: int, finished: asyncio.Future[None], name: str, group: RunGroup | None,
                kill_first: Callable[[int], Awaitable[None]] | None,
                kill_rest: Callable[[], Awaitable[None]] | None) -> None:  # fmt: skip
    if kill_first is not None and not finished.done():
        await kill_first(pid)
    _kill_group(pid)
    if group is not None and not finished.done():  # done: pid 1 and so its whole pid namespace are gone
        group.kill()
    if kill_rest is not None:
        await kill_rest()
    if not finished.done():
        try:
            await asyncio.wait_for(finished, timeout=30)
        except TimeoutError:
            raise RuntimeError(f"{name}: the run did not end 30 s after SIGKILL") from None


async def _first_limit(
    finished: asyncio.Future[None], overflow: asyncio.Event, limits: SandboxLimits, group: RunGroup | None
) -> RunStatus | None:
    """None when the run ended by itself within the limits; else the limit it hit first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.wall_s
    over = asyncio.ensure_future(overflow.wait())
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            step = remaining if group is None else min(remaining, CPU_POLL_S)
            done, _ = await asyncio.wait({finished, over}, timeout=step, return_when=asyncio.FIRST_COMPLETED)
            if overflow.is_set():
                return "output_limit"
            if finished in done:
                finished.result()  # an error of our own (not the program's) propagates
                return None
            if group is not None and group.cpu_seconds() >= limits.cpu_s:
                return "timeout"
    finally:
        over.cancel()


def classify(returncode: int | None, *, oom_kills: int, cpu_s: float | None, limits: SandboxLimits) -> RunStatus:
    """The status of a run that ended by itself, from what the parent observed: the kernel's OOM
    kills in the run's cgroup, its CPU time, and a signal that killed the parent's own child (a
    sandboxed program's exit code is its own choice: exit 152 must not read as SIGXCPU)."""
    if oom_kills > 0:
        return "memory_limit"
    if cpu_s is not None and cpu_s >= limits.cpu_s - 0.01:
        return "timeout"
    if returncode == 0:
        return "ok"
    if returncode == -signal.SIGXCPU:
        return "timeout"
    return "runtime_error"


class _Capped:
    """Keeps the first ``cap`` bytes of a stream; past them sets ``overflow`` and drops the rest
    (still reading: a stream left unread would never reach EOF, and the exit never be reported)."""

    def __init__(self, cap: int, overflow: asyncio.Event) -> None:
        self.cap, self.chunks, self.size, self.overflow = cap, [], 0, overflow

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        while chunk := await stream.read(1 << 16):
            room = self.cap - self.size
            if room > 0:
                self.chunks.append(chunk[:room])
                self.size += min(len(chunk), room)
            if len(chunk) > room:
                self.overflow.set()

    def data(self) -> bytes:
        return b"".join(self.chunks)


async def _feed(proc: asyncio.subprocess.Process, stdin: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(stdin)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):  # the program exited without reading its input
        pass


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
