"""ludic.testing.threads: the thread count a test gives a child process that computes alone, read from the
process's CPU affinity (ludic.kernels.cpu.cores), as the trainer's thread tuner reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ludic.kernels.cpu.cores import usable_cores
from ludic.testing import alone_process_env, alone_threads


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 2), (64, 2)])
def test_alone_threads_is_the_affinity_cores_up_to_two(
    monkeypatch: pytest.MonkeyPatch, cpus: int, threads: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's count is not what the process may use
    assert alone_threads() == threads


@pytest.mark.parametrize(("cpus", "cores"), [(None, 1), (3, 3)])
def test_usable_cores_falls_back_to_cpu_count_without_an_affinity_mask(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, cores: int
) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert usable_cores() == cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_usable_cores_follows_a_real_affinity_mask() -> None:
    """A child pinned to one core (as ``taskset -c 0`` would) sees one core and gives one thread."""
    code = "from ludic.kernels.cpu.cores import usable_cores; from ludic.testing import alone_threads; print(usable_cores(), alone_threads())"
    first = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, {first}),
    )  # fmt: skip
    assert out.stdout.split() == ["1", "1"]


def test_alone_process_env_sets_threads_keeps_the_rest_and_leaves_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LUDIC_SOMETHING", "kept")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    env = alone_process_env()
    assert env["OMP_NUM_THREADS"] == "2" and env["LUDIC_SOMETHING"] == "kept"
    assert os.environ["OMP_NUM_THREADS"] == "1"
