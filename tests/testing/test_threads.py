"""ludic.testing.threads: the thread count a test gives a child process that computes alone."""

from __future__ import annotations

import os

import pytest

from ludic.testing import alone_process_env, alone_threads


@pytest.mark.parametrize(("cpus", "threads"), [(None, 1), (1, 1), (2, 2), (64, 2)])
def test_alone_threads_is_the_cores_up_to_two(monkeypatch: pytest.MonkeyPatch, cpus: int | None, threads: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert alone_threads() == threads


def test_alone_process_env_sets_threads_keeps_the_rest_and_leaves_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LUDIC_SOMETHING", "kept")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    env = alone_process_env()
    assert env["OMP_NUM_THREADS"] == "2" and env["LUDIC_SOMETHING"] == "kept"
    assert os.environ["OMP_NUM_THREADS"] == "1"
