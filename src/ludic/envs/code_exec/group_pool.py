"""Run cgroups kept between runs: creating and removing a group (three hierarchies on cgroup v1)
per run cost the parent about 0.4 ms of system time, and the kernel more to free a memory cgroup.

A group is handed to one run at a time and kept only when that run left it empty (every process
killed and gone); its limits are those it was created with (groups are kept per limits), and its
CPU time and OOM kills are read from ``RunGroup.start`` on. Kept groups are removed at exit (a
process killed before it exits leaves its kept groups, empty, as one killed mid-run left its run's;
they are not swept by others: a live process in another pid namespace cannot be told from a dead one).
"""

from __future__ import annotations

import atexit
import contextlib
import threading

from ludic.envs.code_exec.cgroup import CgroupHost, RunGroup

KEEP_PER_LIMITS = 64
"""At most this many empty groups are kept per (memory, processes) limits."""


class GroupPool:
    """Empty run groups of one ``CgroupHost``, reused (one pool per host and process: ``pool_for``)."""

    def __init__(self, host: CgroupHost) -> None:
        self.host = host
        self._idle: dict[tuple[int, int], list[RunGroup]] = {}
        self._lock = threading.Lock()  # runners may run on several event loops (threads) at once

    def acquire(self, *, memory_bytes: int, max_processes: int) -> RunGroup:
        """An empty group with these limits, counting from now."""
        with self._lock:
            idle = self._idle.get((memory_bytes, max_processes), [])
            group = idle.pop() if idle else None
        if group is not None:  # kept only empty (``release``); only root could have put a process in since
            try:
                group.start()
                return group
            except OSError:  # removed meanwhile (e.g. by hand): make a new one
                pass
        group = RunGroup(self.host, memory_bytes=memory_bytes, max_processes=max_processes)
        group.start()
        return group

    def release(self, group: RunGroup) -> None:
        """After the run: keep the group only if it is empty, else kill what is left and remove it
        (``remove`` waits for the kernel to empty it and raises if it cannot)."""
        if group.pids():  # the run's end killed everything; what is still exiting goes with the group
            group.kill()
            group.remove()
            return
        with self._lock:
            idle = self._idle.setdefault(group.limits, [])
            if len(idle) < KEEP_PER_LIMITS:
                idle.append(group)
                return
        group.remove()

    def close(self) -> None:
        """Remove every kept group (at exit)."""
        with self._lock:
            groups = [g for idle in self._idle.values() for g in idle]
            self._idle.clear()
        for group in groups:
            with contextlib.suppress(RuntimeError):
                group.remove()


_POOLS: dict[str, GroupPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(host: CgroupHost) -> GroupPool:
    """This process's pool for ``host`` (created, and its removal at exit registered, once)."""
    with _POOLS_LOCK:
        key = host.describe()
        if key not in _POOLS:
            _POOLS[key] = GroupPool(host)
            atexit.register(_POOLS[key].close)
        return _POOLS[key]

