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
import resource
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

RunStatus = Literal["ok", "runtime_error", "timeout", "memory_limit", "output_limit", "killed"]


class SandboxUnavailableError(RuntimeError):
    """Bubblewrap cannot run here; untrusted code is refused unless the user opts out by name."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. Each field is enforced by the kernel (rlimits) or by the parent's watchdog."""

    wall_s: float = 5.0
    """Wall-clock seconds before the whole sandbox is killed (watchdog in the parent)."""
    cpu_s: int = 2
    """CPU seconds (RLIMIT_CPU); a busy loop dies of SIGXCPU."""
    memory_mb: int = 512
    """Address space in MiB (RLIMIT_AS); a larger allocation raises MemoryError."""
    max_processes: int = 16
    """Processes of the run's user id (RLIMIT_NPROC); each pool slot has its own uid."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 1 << 20
    """Bytes of stdout (and, separately, stderr) kept; more kills the run (status output_limit)."""
    tmp_size_mb: int = 16
    """Size of the private writable /tmp (tmpfs) and the largest file (RLIMIT_FSIZE)."""

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "memory_mb", "max_processes", "max_open_files", "max_output_bytes",
                     "tmp_size_mb"):  # fmt: skip
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


@runtime_checkable
class CodeRunner(Protocol):
    """Runs ``/code/solution.py`` (from ``code_dir``) on ``stdin`` under ``limits`` as pool slot ``slot``."""

    name: str

    async def run(self, code_dir: Path, stdin: bytes, limits: SandboxLimits, *, slot: int) -> RunOutcome: ...


def rlimit_setter(limits: SandboxLimits, *, nproc: bool = True):
    """A ``preexec_fn`` applying the limits in the child, after it dropped to its user id."""

    def apply() -> None:
        os.setsid()
        mem = limits.memory_mb << 20
        fsize = limits.tmp_size_mb << 20
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))

    return apply


async def run_limited(
    argv: list[str],
    stdin: bytes,
    limits: SandboxLimits,
    *,
    user: int | None,
    env: dict[str, str] | None,
    kill_rest: Callable[[], Awaitable[None]] | None = None,
    kill_first: Callable[[int], Awaitable[None]] | None = None,
) -> RunOutcome:
    """Start ``argv`` in its own session with the limits, feed stdin, collect capped output,
    kill the whole process group on the wall limit or too much output. ``kill_first(pid)`` runs
    before that group kill (to stop what ``argv`` started in the right order); ``kill_rest``
    after it, killing whatever else the run started (processes outside the group still holding
    its pipes). Output past the cap is read and dropped until the pipes close, so that the exit
    (which asyncio reports only once every pipe is closed) can always be awaited."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    ids = {} if user is None else {"user": user, "group": user, "extra_groups": []}
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        preexec_fn=rlimit_setter(limits),
        **ids,
    )
    overflow = asyncio.Event()
    out, err = _Capped(limits.max_output_bytes, overflow), _Capped(limits.max_output_bytes, overflow)

    async def communicate() -> None:
        await asyncio.gather(_feed(proc, stdin), out.drain(proc.stdout), err.drain(proc.stderr))
        await proc.wait()

    finished = asyncio.ensure_future(communicate())
    status: RunStatus | None = None
    try:
        status = await _first_limit(finished, overflow, limits.wall_s)
    finally:
        if kill_first is not None:
            await kill_first(proc.pid)
        _kill_group(proc.pid)
        if kill_rest is not None:
            await kill_rest()
        if not finished.done():
            try:
                await asyncio.wait_for(finished, timeout=30)
            except TimeoutError:
                raise RuntimeError(f"{argv[0]}: the run did not end 30 s after SIGKILL") from None
    stdout, stderr = out.data(), err.data()
    return RunOutcome(
        status or classify(proc.returncode, stderr), proc.returncode, stdout, stderr, loop.time() - started
    )


async def _first_limit(finished: asyncio.Future[None], overflow: asyncio.Event, wall_s: float) -> RunStatus | None:
    """None when the run ended by itself within the limits; else the limit it hit first."""
    over = asyncio.ensure_future(overflow.wait())
    try:
        done, _ = await asyncio.wait({finished, over}, timeout=wall_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        over.cancel()
    if overflow.is_set():
        return "output_limit"
    if finished in done:
        finished.result()  # an error of our own (not the program's) propagates
        return None
    return "timeout"


def classify(returncode: int | None, stderr: bytes) -> RunStatus:
    """The status of a run that ended by itself (bwrap reports a child killed by signal N as 128+N)."""
    if returncode == 0:
        return "ok"
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if b"MemoryError" in stderr[-4096:]:
        return "memory_limit"
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "killed"
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
