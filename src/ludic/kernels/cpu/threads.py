"""Intra-op threads that follow the cores free right now, so other work on the machine cannot stall a team.

Why: torch splits every op over its OpenMP team and ends it at a barrier. On a dedicated machine that is
the fastest way to run; when other processes hold the cores, a team member waits in the run queue while
its partners wait at the barrier for it (spinning, under ``OMP_WAIT_POLICY=ACTIVE``, on a core it needs),
so each op lasts about a scheduler time slice instead of microseconds. A decoding step is hundreds of
small ops, so the step slows by far more than the share of CPU taken away (26x measured with two busy
loops on 2 cores; one thread per process slowed 3x). Two torch threads of one process (the embedded
engine decoding beside the trainer's step) oversubscribe the cores the same way.

So the engine and the trainer call :func:`fit_threads` on their computing thread before each piece of
work: it sets that thread's intra-op count to the cores not taken by other processes' runnable threads
(Linux ``/proc``: the system's running count minus this process's own), shared among this process's
computing threads, between 1 and the count torch started with. Checks are at most every
``CHECK_INTERVAL_S`` and a reduction needs the load seen on ``SAMPLES`` checks in a row, so a brief burst
does not cost a quiet machine its threads. ``LUDIC_CPU_THREADS=fixed`` keeps torch's own count.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterator

import torch

from ludic.kernels.cpu.cores import usable_cores

ENV = "LUDIC_CPU_THREADS"
MODES = ("auto", "fixed")
CHECK_INTERVAL_S = 0.25
SAMPLES = 3


def threads_for(*, cores: int, others_running: int, users: int, max_threads: int) -> int:
    """The intra-op threads for one of ``users`` computing threads: the free cores shared, in [1, max_threads]."""
    free = cores - max(others_running, 0)
    return max(1, min(max_threads, free // max(users, 1)))


def _mode() -> str:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"${ENV}={os.environ[ENV]!r}: expected one of {', '.join(MODES)}")
    return mode


def _running_total() -> int | None:
    """Threads running or runnable on the whole machine (``/proc/loadavg``'s ``R/T``), None off Linux."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _running_own() -> int:
    """This process's threads running or runnable now (its spinning OpenMP workers included)."""
    count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        count += state == "R"
    return max(count, 1)


class CpuThreads:
    """The process's one view of the free cores; ``fit()`` on a computing thread sets its intra-op count."""

    def __init__(self, *, interval_s: float = CHECK_INTERVAL_S, samples: int = SAMPLES) -> None:
        self.interval_s = interval_s
        self.max_threads = torch.get_num_threads()  # what OMP_NUM_THREADS / torch chose: the ceiling
        self.cores = usable_cores()
        self._others: deque[int] = deque(maxlen=samples)
        self._checked = -float("inf")
        self._users = 0
        self._lock = threading.Lock()
        self.threads = self.max_threads  # the last count decided

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Mark the calling thread as computing (the free cores are shared among such threads)."""
        with self._lock:
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1

    def decide(self) -> int:
        """The count for a computing thread now (reads ``/proc`` at most every ``interval_s``)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= self.interval_s:
                self._checked = now
                total = _running_total()
                if total is not None:
                    self._others.append(total - _running_own())
            if not self._others:
                return self.max_threads
            # a reduction needs the load on every recent check; more threads as soon as one check is quiet
            others = min(self._others) if len(self._others) == self._others.maxlen else 0
            self.threads = threads_for(
                cores=self.cores, others_running=others, users=self._users, max_threads=self.max_threads
            )
            return self.threads

    def fit(self) -> int:
        """Set the calling thread's intra-op count to :meth:`decide`'s; returns it."""
        if _mode() == "fixed":
            return torch.get_num_threads()
        n = self.decide()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n


_SHARED: CpuThreads | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> CpuThreads:
    """The process's CpuThreads (created on first use: the ceiling is torch's count then)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = CpuThreads()
        return _SHARED


def fit_threads() -> int:
    """``shared().fit()``: set this thread's intra-op count to the cores free now."""
    return shared().fit()
