"""Intra-op threads follow the free cores: other processes' runnable threads take cores away, this process's
computing threads (engine, trainer) share what is left, and a brief burst does not count."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from ludic.kernels.cpu import threads as cpu_threads
from ludic.kernels.cpu.threads import CpuThreads, threads_for


@pytest.mark.parametrize(
    ("cores", "others", "users", "ceiling", "expected"),
    [
        (2, 0, 1, 2, 2),  # a quiet machine: every core
        (2, 1, 1, 2, 1),  # one busy loop: one thread
        (2, 2, 1, 2, 1),  # two busy loops: one thread, never 0
        (2, 0, 2, 2, 1),  # engine and trainer computing at once: one each, not two teams of two
        (8, 2, 2, 8, 3),
        (8, 0, 1, 4, 4),  # never above the count torch started with
        (2, -3, 1, 2, 2),  # a count read mid-change cannot give more than the cores
    ],
)
def test_threads_for(cores, others, users, ceiling, expected) -> None:
    assert threads_for(cores=cores, others_running=others, users=users, max_threads=ceiling) == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_busy_processes_on_every_core_bring_a_computing_thread_to_one_intra_op_thread() -> None:
    ct = CpuThreads(interval_s=0.0)
    ct.max_threads = ct.cores  # as if OMP_NUM_THREADS were the core count
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ct.cores)]
    seen: list[int] = []

    def work() -> None:
        torch.set_num_threads(ct.cores)
        with ct.computing():
            time.sleep(0.5)  # the busy loops are running
            for _ in range(ct._others.maxlen or 1):
                time.sleep(0.05)
                ct.fit()
            seen.append(torch.get_num_threads())

    try:
        worker = threading.Thread(target=work)  # its own intra-op setting: the test's thread keeps its own
        worker.start()
        worker.join(30)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert seen == [1]


def test_one_busy_sample_is_not_enough_to_drop_threads(monkeypatch) -> None:
    ct = CpuThreads(interval_s=0.0, samples=3)
    ct.max_threads = 2
    ct.cores = 2
    loads = iter([5, 1, 1, 1, 1])  # a burst on the first check only (this process: 1 running)
    monkeypatch.setattr(cpu_threads, "_running_total", lambda: next(loads))
    monkeypatch.setattr(cpu_threads, "_running_own", lambda: 1)
    with ct.computing():
        assert [ct.decide() for _ in range(4)] == [2, 2, 2, 2]  # fewer than 3 samples, then a quiet one among them
    loads = iter([5, 5, 5])
    ct._others.clear()
    with ct.computing():
        assert [ct.decide() for _ in range(3)] == [2, 2, 1]  # busy on 3 checks in a row: one thread


def test_the_mode_is_read_from_the_environment_and_a_bad_one_is_named(monkeypatch) -> None:
    monkeypatch.setenv("LUDIC_CPU_THREADS", "fixed")
    before = torch.get_num_threads()
    ct = CpuThreads(interval_s=0.0)
    ct.max_threads = 64
    assert ct.fit() == before == torch.get_num_threads()
    monkeypatch.setenv("LUDIC_CPU_THREADS", "sometimes")
    with pytest.raises(ValueError, match="LUDIC_CPU_THREADS='sometimes'"):
        ct.fit()
