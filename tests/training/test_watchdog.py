"""The step watchdog: a step that stops advancing is reported (the step, the time since it advanced, every
thread's stack with the blocked frame's function), tagged with the rank, and ``on_stall="exit"`` ends the
process with a non-zero code so torchrun tears the job down."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ludic.testing import torchrun_argv
from ludic.training.watchdog import STALL_EXIT_CODE, StepWatchdog, watch_steps

WORKER = Path(__file__).with_name("watchdog_worker.py")


def blocked_in_the_step(release: threading.Event) -> None:
    release.wait(30)


def _wait_for_report(dog: StepWatchdog, within_s: float) -> float:
    started = time.monotonic()
    while not dog.reports and time.monotonic() - started < within_s:
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_blocked_step_is_reported_within_its_bound_with_the_blocked_frame(caplog) -> None:
    release = threading.Event()
    step = threading.Thread(target=blocked_in_the_step, args=(release,), name="the-step")
    step.start()
    caplog.set_level(logging.ERROR, logger="ludic.training.watchdog")
    try:
        with watch_steps(lambda: 3, bound_s=0.5, poll_s=0.05) as dog:
            waited = _wait_for_report(dog, 5.0)
    finally:
        release.set()
        step.join()
    assert 0.5 <= waited <= 0.5 + 0.4, waited
    report = dog.reports[0]
    assert report.startswith(f"[process {os.getpid()}] step watchdog: training step 4 (after step 3) has not advanced")
    assert "(bound 0.5 s, [timeouts].step_watchdog_s); still waiting" in report
    assert 'Thread "the-step"' in report and "in blocked_in_the_step" in report
    assert "ludic-step-watchdog" not in report  # its own stack is left out
    assert [r.levelno for r in caplog.records] == [logging.ERROR] and caplog.records[0].getMessage() == report


def test_steps_that_advance_are_never_reported_and_a_stall_is_reported_again_each_bound() -> None:
    counter = {"step": 0}
    with watch_steps(lambda: counter["step"], bound_s=0.4, poll_s=0.02) as dog:
        for _ in range(12):  # 0.1 s per step: always under the bound
            time.sleep(0.1)
            counter["step"] += 1
        assert dog.reports == []
        time.sleep(1.0)  # now stalled for ~2.5 bounds
    assert len(dog.reports) == 2 and all("training step 13 (after step 12)" in r for r in dog.reports)


def test_rank_tag_comes_from_torchruns_rank(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "5")
    with watch_steps(lambda: 0, bound_s=0.2, poll_s=0.02) as dog:
        _wait_for_report(dog, 3.0)
    assert dog.reports[0].startswith("[rank 5] step watchdog")


@pytest.mark.parametrize("bad", [{"bound_s": 0}, {"on_stall": "abort"}])
def test_wrong_settings_are_refused(bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        StepWatchdog(lambda: 0, **{"bound_s": 1.0, **bad})


@pytest.mark.timeout(60)
def test_on_stall_exit_ends_the_process_with_its_code_and_the_report() -> None:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(WORKER), "single", "1.0"], capture_output=True, text=True, timeout=50)
    took = time.monotonic() - started
    assert proc.returncode == STALL_EXIT_CODE, proc.stderr[-2000:]
    assert took < 20  # not the step's 60 s sleep
    assert "training step 4 (after step 3) has not advanced" in proc.stderr and "exiting with code 70" in proc.stderr
    assert "in waiting_for_a_peer" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_under_torchrun_rank_0s_watchdog_names_its_rank_and_the_collective_and_ends_the_job(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = torchrun_argv(tmp_path / "torchrun", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                        f"--master_port={_free_port()}", str(WORKER), "torchrun", "3.0")  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110)
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert took < 55, f"the job ran {took:.0f} s: torchrun did not tear it down after rank 0 exited"
    report = out[out.index("[rank 0] step watchdog") :]
    assert "training step 1 (after step 0) has not advanced for" in report
    assert "in barrier" in report  # torch.distributed's barrier, the collective rank 0 waits in
    assert "[rank 1] step watchdog" not in out
