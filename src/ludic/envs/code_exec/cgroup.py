"""One control group per sandbox run, so that memory, processes and CPU are bounded for the run as a
whole (rlimits bound each process: ten children each under RLIMIT_AS held 4,000 MiB under a 512 MiB
limit) and so that what the run hit is read from the kernel's counters, not from its output.

cgroup v2 where this process may create groups with the memory and pids controllers (a delegated
subtree), else cgroup v1 (memory, pids and cpuacct hierarchies writable, e.g. as root on a hybrid
host); ``detect`` says why neither is usable, and the runner then refuses or degrades as chosen.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

GROUP_DIR = "ludic-sandbox"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
_names = itertools.count()
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CgroupHost:
    """Where this process creates run groups: v2 one directory, v1 one per controller."""

    version: str
    dirs: dict[str, Path]

    def describe(self) -> str:
        return f"cgroup {self.version} ({', '.join(str(d) for d in self.dirs.values())})"


def _own_paths(self_cgroup: Path) -> dict[str, str]:
    """Controller name ('' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in self_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path.lstrip("/")
    return paths


def detect(root: Path = Path("/sys/fs/cgroup"), self_cgroup: Path = Path("/proc/self/cgroup")) -> CgroupHost | str:
    """The cgroups this process may create run groups in, else why none (one line)."""
    try:
        own = _own_paths(self_cgroup)
    except OSError as exc:
        return f"cannot read {self_cgroup}: {exc}"
    reasons = []
    for find in (_detect_v2, _detect_v1):
        found = find(root, own)
        if isinstance(found, CgroupHost):
            return found
        reasons.append(found)
    return "; ".join(reasons)


def _detect_v2(root: Path, own: dict[str, str]) -> CgroupHost | str:
    mount = root if (root / "cgroup.controllers").exists() else root / "unified"
    if not (mount / "cgroup.controllers").exists() or "" not in own:
        return f"no cgroup v2 mount at {root}"
    parent = mount / own[""]
    try:
        available = (parent / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"cgroup v2: {exc}"
    if not {"memory", "pids"} <= set(available):
        return f"cgroup v2 at {parent} offers {available or 'no controllers'}, not memory and pids"
    base = parent / GROUP_DIR
    try:
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+memory +pids")
        _try_group(base)
    except OSError as exc:
        return f"cgroup v2: cannot create {base} with memory and pids ({exc.strerror}; not delegated to uid {os.geteuid()})"
    return CgroupHost("v2", {"unified": base})


def _detect_v1(root: Path, own: dict[str, str]) -> CgroupHost | str:
    dirs = {}
    for name in V1_CONTROLLERS:
        mount = root / name
        if not (mount / "cgroup.procs").exists() or name not in own:
            return f"no cgroup v1 {name} hierarchy at {mount}"
        base = mount / own[name] / GROUP_DIR
        try:
            base.mkdir(exist_ok=True)
            _try_group(base)
        except OSError as exc:
            return f"cgroup v1: cannot create {base} ({exc.strerror}; uid {os.geteuid()} may not create groups there)"
        dirs[name] = base
    return CgroupHost("v1", dirs)


def _try_group(base: Path) -> None:
    """Create and remove a group under ``base`` (raises OSError where this uid may not)."""
    probe = base / f"probe-{os.getpid()}-{next(_names)}"
    probe.mkdir()
    probe.rmdir()


class RunGroup:
    """The group of one run: limits set on creation, joined by the run's first process (before it
    execs bwrap, so everything the run starts is inside), read, killed and removed by the parent."""

    def __init__(self, host: CgroupHost, *, memory_bytes: int, max_processes: int) -> None:
        self.host = host
        self.limits = (memory_bytes, max_processes)
        self._base_cpu, self._base_oom = (0.0, 0.0), 0
        name = f"run-{os.getpid()}-{next(_names)}"
        self.dirs = {controller: base / name for controller, base in host.dirs.items()}
        for path in self.dirs.values():
            _fresh_dir(path)
        if host.version == "v2":
            self._write("unified", "memory.max", memory_bytes)
            self._write("unified", "memory.swap.max", 0, optional=True)
            self._write("unified", "pids.max", max_processes)
        else:
            self._write("memory", "memory.limit_in_bytes", memory_bytes)
            self._write("memory", "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            self._write("pids", "pids.max", max_processes)

    def _write(self, controller: str, name: str, value: int, *, optional: bool = False) -> None:
        path = self.dirs[controller] / name
        if optional and not path.exists():
            return
        path.write_text(str(value))

    @property
    def join_files(self) -> tuple[str, ...]:
        """The files the run's first process writes ``0`` (itself) to, to join. v1: ``tasks``, which
        moves the calling thread only and so skips the global threadgroup lock that a write to
        ``cgroup.procs`` takes (its RCU sync cost 11-14 ms per run on a busy host; the process is
        single-threaded between fork and exec, so its one thread is the whole process). v2 moves
        whole processes only: ``cgroup.procs``."""
        name = "cgroup.procs" if self.host.version == "v2" else "tasks"
        return tuple(str(d / name) for d in self.dirs.values())

    def start(self) -> None:
        """Count from now: a group reused for another run (``GroupPool``) reports that run's CPU time
        and OOM kills only (the kernel's counters are cumulative: read as differences)."""
        self._base_cpu, self._base_oom = self._cpu_totals(), self._oom_total()

    def cpu_seconds(self) -> float:
        """CPU time used by every process of the run so far: the larger of the scheduler's runtime
        and the tick-sampled user+system time (what RLIMIT_CPU counts; on a busy host it runs ahead)."""
        usage_s, ticks_s = self._cpu_totals()
        return max(usage_s - self._base_cpu[0], ticks_s - self._base_cpu[1])

    def _cpu_totals(self) -> tuple[float, float]:
        if self.host.version == "v2":
            stat = dict(line.split() for line in (self.dirs["unified"] / "cpu.stat").read_text().splitlines())
            ticks_s = (int(stat.get("user_usec", 0)) + int(stat.get("system_usec", 0))) / 1e6
            return int(stat["usage_usec"]) / 1e6, ticks_s
        acct = self.dirs["cpuacct"]
        stat = dict(line.split() for line in (acct / "cpuacct.stat").read_text().splitlines())
        ticks_s = (int(stat["user"]) + int(stat["system"])) / _CLOCK_TICKS
        return int((acct / "cpuacct.usage").read_text()) / 1e9, ticks_s

    def oom_kills(self) -> int:
        """Processes of the run the kernel killed for passing the memory limit."""
        return self._oom_total() - self._base_oom

    def _oom_total(self) -> int:
        if self.host.version == "v2":
            counters = (self.dirs["unified"] / "memory.events").read_text()
        else:
            counters = (self.dirs["memory"] / "memory.oom_control").read_text()
        for line in counters.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        path = next(iter(self.dirs.values())) / "cgroup.procs"
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in path.read_text().split()]
        return []

    def kill(self) -> None:
        """SIGKILL every process of the run (v2: ``cgroup.kill`` where the kernel has it)."""
        kill_file = self.dirs.get("unified", Path("/nonexistent")) / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout_s: float = 2.0) -> None:
        """Kill what is left and remove the group (rmdir fails while a process is still inside)."""
        deadline = time.monotonic() + timeout_s
        for path in self.dirs.values():
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise RuntimeError(f"cannot remove the run's cgroup {path}: {exc}") from None
                    self.kill()
                    time.sleep(0.002)


def _fresh_dir(path: Path) -> None:
    """Create ``path``; a stale group of the same name (a crashed run's) is emptied and replaced."""
    try:
        path.mkdir()
    except FileExistsError:
        for pid in (int(p) for p in (path / "cgroup.procs").read_text().split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        path.rmdir()
        path.mkdir()
