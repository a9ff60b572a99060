"""Thread counts for a test's child process that computes while nothing else does.

The test suite runs with one intra-op thread (``OMP_NUM_THREADS=1``): most tests start several processes
that compute at once, and spin-waiting threads on a busy 2-core machine slow each other many times over. A
test that starts one process and only waits for it (or a server and a trainer that compute in turn) gives
that child the cores a user's run would have.
"""

from __future__ import annotations

import os

from ludic.kernels.cpu.cores import usable_cores

MAX_ALONE_THREADS = 2
"""Threads for a child computing alone: beyond two, the tiny and small models here gain little."""


def alone_threads() -> int:
    """Intra-op threads for a child process that has the machine to itself while the test waits."""
    return min(MAX_ALONE_THREADS, usable_cores())


def alone_process_env() -> dict[str, str]:
    """The test's environment with ``OMP_NUM_THREADS`` set for a child computing alone."""
    return {**os.environ, "OMP_NUM_THREADS": str(alone_threads())}
