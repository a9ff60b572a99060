"""The sandbox bounds the host, not only each process: run-wide limits, the options that choose them,
killed runs that leave nothing behind (even under a trainer running as pid 1), the uid lock
directory, and the reply parser's linear time. The adversarial programs themselves are in
``adversarial.py`` (run by ``test_sandbox_security.py`` and, without root, ``test_sandbox_unprivileged.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ludic.envs.code_exec import BubblewrapRunner, SandboxLimits, SandboxUnavailableError, extract_code
from ludic.envs.code_exec.bwrap import claimed_uid

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the run's cgroup needs root on this host (cgroup v1)")

SPIN_IN_FOUR_PROCESSES = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        break
end = time.process_time() + 0.9  # each process stays under the per-process RLIMIT_CPU
while time.process_time() < end:
    pass
print("done")
"""
TOUCH_600_MB = "b = bytearray(600 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\nprint(len(b))\n"


@pytest.fixture(scope="module")
def runner():
    return BubblewrapRunner()


def test_extract_code_is_linear_on_a_fence_of_blanks():
    reply = "```" + " " * 131_072 + "```"
    started = time.perf_counter()
    assert extract_code(reply) == reply  # no opening fence line: the whole reply
    extract_code("```" + " " * 131_072 + "python" + "\t" * 131_072 + "x\n```")
    extract_code("``` " * 100_000)
    assert time.perf_counter() - started < 0.5  # the quadratic regex took ~7 s for the first alone
    assert extract_code("```  python3 \t\nprint(1)\n```") == "print(1)\n"
    assert extract_code("```py\na\n```\n```\nb\n```") == "b\n"
    assert extract_code("```java\nx\n```") == "```java\nx\n```"  # not a Python fence: the whole reply


def test_the_uid_lock_directory_must_be_a_private_directory_of_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lock_dir, target = tmp_path / "ludic-sandbox-uids", tmp_path / "elsewhere"
    target.mkdir()
    lock_dir.symlink_to(target)  # planted by another local user before the trainer's first run
    with pytest.raises(RuntimeError, match="not a plain directory"), claimed_uid(70000, 0):
        pass
    assert list(target.iterdir()) == []  # nothing created where the link points
    lock_dir.unlink()
    lock_dir.mkdir(mode=0o777)
    lock_dir.chmod(0o777)
    with pytest.raises(RuntimeError, match="mode is 0777"), claimed_uid(70000, 0):
        pass
    if ROOT:
        lock_dir.chmod(0o700)
        os.chown(lock_dir, 12345, 12345)
        with pytest.raises(RuntimeError, match="owned by uid 12345"), claimed_uid(70000, 0):
            pass
    lock_dir.rmdir()
    with claimed_uid(70000, 0) as uid:  # absent: created private
        assert uid == 70000 and (lock_dir.stat().st_mode & 0o777) == 0o700
        assert not (lock_dir / "70000.lock").is_symlink()


def test_without_cgroups_the_runner_refuses_unless_per_process_limits_are_chosen(tmp_path, code_dir, runner):
    with pytest.raises(SandboxUnavailableError, match="require_run_limits=False"):
        BubblewrapRunner(cgroup_root=tmp_path)
    with pytest.warns(RuntimeWarning, match="bounded per process only"):
        degraded = BubblewrapRunner(cgroup_root=tmp_path, require_run_limits=False)
    assert degraded.run_limits.startswith("none")

    limits = SandboxLimits(memory_mb=256, wall_s=10)
    outcome = asyncio.run(degraded.run(code_dir(TOUCH_600_MB), b"", limits, slot=0))
    assert outcome.status == "runtime_error" and b"MemoryError" in outcome.stderr  # RLIMIT_AS, unobserved
    if ROOT:  # with the run's cgroup the kernel's OOM kill is observed
        assert runner.run_limits.startswith("cgroup")
        outcome = asyncio.run(runner.run(code_dir(TOUCH_600_MB), b"", limits, slot=0))
        assert outcome.status == "memory_limit"


@needs_root
async def test_cpu_time_is_bounded_for_the_whole_run(code_dir, runner):
    limits = SandboxLimits(cpu_s=1, wall_s=20)
    outcome = await runner.run(code_dir(SPIN_IN_FOUR_PROCESSES), b"", limits, slot=0)
    # four processes of 0.9 s each: 3.6 s in all before; now stopped when the run reaches 1 s
    assert outcome.status == "timeout" and outcome.stdout == b""
    assert outcome.cpu_s is not None and 1.0 <= outcome.cpu_s < 1.6
    assert outcome.wall_s < 15  # stopped by CPU time, not by the wall limit


async def test_tmp_max_files_bounds_the_scratch_inodes(code_dir, runner):
    code = "n = 0\ntry:\n    for n in range(10_000):\n        open(f'/tmp/{n}', 'w').close()\nexcept OSError:\n    print(n)\n"
    for max_files in (100, 300):
        limits = SandboxLimits(tmp_max_files=max_files, wall_s=20)
        outcome = await runner.run(code_dir(code), b"", limits, slot=0)
        assert outcome.status == "ok" and max_files - 5 <= int(outcome.stdout) < max_files


async def test_a_killed_run_leaves_nothing_and_costs_no_wait(code_dir, runner):
    sleeper = code_dir("import time\nwhile True:\n    time.sleep(1)\n")
    for _ in range(3):
        started = time.monotonic()
        outcome = await runner.run(sleeper, b"", SandboxLimits(wall_s=0.5), slot=0)
        assert outcome.status == "timeout"
        assert time.monotonic() - started < 1.2  # waiting for the orphaned init cost 1.2-2 s more


PID1_TRAINER = """
import asyncio, json, os, sys, tempfile, time
from pathlib import Path
from ludic.envs.code_exec import BubblewrapRunner, SandboxLimits

def zombies():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        found.append(int(pid))
            except OSError:
                pass
    return found

async def main():
    with tempfile.TemporaryDirectory(prefix="ludic-pid1-code-") as tmp:  # removed after
        await run_all(BubblewrapRunner(), Path(tmp))

async def run_all(runner, code_dir):
    code_dir.chmod(0o755)
    report = {"pid": os.getpid(), "killed": [], "after": []}
    for code, key, wall in (("import time\\nwhile True: time.sleep(1)\\n", "killed", 0.5), ("print(1)\\n", "after", 5)):
        (code_dir / "solution.py").write_text(code); (code_dir / "solution.py").chmod(0o644)
        for _ in range(4):
            started = time.monotonic()
            outcome = await runner.run(code_dir, b"", SandboxLimits(wall_s=wall), slot=0)
            report[key].append([outcome.status, time.monotonic() - started])
    report["zombies"] = zombies()
    print(json.dumps(report))

asyncio.run(main())
"""


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_under_a_trainer_running_as_pid_1_killed_runs_leave_no_zombie(tmp_path):
    """A container without an init: the trainer is pid 1 and reaps nothing it did not start."""
    script = tmp_path / "trainer.py"
    script.write_text(PID1_TRAINER)
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["pid"] == 1
    assert report["zombies"] == []
    assert [status for status, _ in report["killed"]] == ["timeout"] * 4
    assert [status for status, _ in report["after"]] == ["ok"] * 4
    assert max(wall for _, wall in report["killed"]) < 1.5
    assert max(wall for _, wall in report["after"]) < 1.5
