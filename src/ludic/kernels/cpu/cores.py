"""How many cores this process may run on: its CPU affinity (a container's or ``taskset``'s share), not the
machine's count. Torch-free, so test helpers and the thread tuner read the same number."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores in this process's affinity mask (``os.cpu_count()`` where the OS has no such mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
