"""The Linux calls under :class:`ludic.testing.netns.HostNetwork`: ``ip``/``tc`` with a bound and a clear
error, the processes inside a namespace, stale namespaces of dead runs, and code run inside a namespace.

Every call here is bounded in time: a wedged ``ip`` or a process that ignores SIGKILL (stuck in the kernel)
fails the caller with the command and what it waited, never hangs a test run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

COMMAND_TIMEOUT_S = 15.0  # one `ip`/`tc` call; they take milliseconds, the bound only catches a wedged kernel
NAMESPACE_PREFIX = "ludic-"  # every namespace Ludic's tests make starts with it, then "<pid>-<seq>-"
_STALE = re.compile(rf"^{re.escape(NAMESPACE_PREFIX)}(\d+)-\d+-")
_CLONE_NEWNET = 0x40000000  # <linux/sched.h>


class NetworkCommandError(RuntimeError):
    """An ``ip``/``tc`` (or a command run in a host) failed: the message names the command and its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.argv, self.returncode, self.stderr = list(argv), returncode, stderr
        status = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(f"`{' '.join(argv)}` {status}: {stderr.strip() or '(no stderr)'}")


def command(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run ``argv`` (an ``ip``/``tc`` call) and return its stdout; NetworkCommandError on failure or timeout."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise NetworkCommandError(argv, None, f"no answer after {timeout:.0f} s") from err
    except FileNotFoundError as err:
        raise NetworkCommandError(
            argv, 127, f"{argv[0]} is not installed (iproute2 provides ip and tc)"
        ) from err
    if done.returncode != 0:
        raise NetworkCommandError(argv, done.returncode, done.stderr)
    return done.stdout


def namespaces() -> list[str]:
    """Names of the machine's named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in command(["ip", "netns", "list"]).splitlines() if line.strip()]


def namespace_pids(namespace: str) -> list[int]:
    """Pids of every process whose network namespace is ``namespace`` (children and grandchildren too)."""
    try:
        out = command(["ip", "netns", "pids", namespace])
    except NetworkCommandError:
        return []  # the namespace is already gone: nothing runs in it
    return [int(p) for p in out.split()]


def kill_pids(pids: Sequence[int], what: str, timeout: float = 10.0) -> None:
    """SIGKILL ``pids`` and wait (bounded) until they are gone; TimeoutError naming ``what`` otherwise."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive:
        alive = [pid for pid in alive if _alive(pid)]
        if alive and time.monotonic() > deadline:
            raise TimeoutError(f"processes {alive} in {what} still alive {timeout:.0f} s after SIGKILL")
        if alive:
            time.sleep(0.02)


def kill_namespace(namespace: str, timeout: float = 10.0) -> None:
    """SIGKILL every process in ``namespace`` until none is left (a dying process may have forked once more)."""
    deadline = time.monotonic() + timeout
    while pids := namespace_pids(namespace):
        kill_pids(pids, f"namespace {namespace}", timeout=max(0.1, deadline - time.monotonic()))
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {namespace} still has processes after {timeout:.0f} s of SIGKILL")


def delete_namespace(namespace: str) -> None:
    """Kill what runs in ``namespace`` and delete it (its veth ends go with it); a missing one is fine."""
    if namespace not in namespaces():
        return
    kill_namespace(namespace)
    command(["ip", "netns", "del", namespace])


def remove_stale_namespaces() -> list[str]:
    """Delete the namespaces a killed earlier run left: prefix ``ludic-<pid>-`` where no process has that pid.

    A run killed with SIGKILL never ran its ``close()``; its namespaces (and the processes still inside
    them) would pile up. Namespaces of live runs (other test processes on the machine) are left alone.
    """
    removed = []
    for name in namespaces():
        match = _STALE.match(name)
        if match and not _alive(int(match.group(1))):
            delete_namespace(name)
            removed.append(name)
    return removed


def call_in_namespace(namespace: str, fn: Callable[..., T], *args: object, timeout: float = 30.0) -> T:
    """``fn(*args)`` on a fresh thread that has joined ``namespace``'s network: its sockets live there.

    A network namespace is per thread in Linux (``setns(CLONE_NEWNET)``), so the calling process and its
    other threads stay in their own network. A socket keeps its namespace once made, so it may be handed
    back and used from any thread. TimeoutError if ``fn`` has not returned after ``timeout`` seconds.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into network namespace {namespace}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn(*args))
        except BaseException as err:
            error.append(err)

    thread = threading.Thread(target=body, name=f"netns-{namespace}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)!s} in namespace {namespace} ran past {timeout:g} s")
    if error:
        raise error[0]
    return result[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0 but is gone for every purpose here (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
