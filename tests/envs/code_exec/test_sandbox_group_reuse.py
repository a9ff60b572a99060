"""Run cgroups are kept between runs (``group_pool``): a kept group reads only its own run's CPU time
and OOM kills, is reused only empty, and every process of a run still joins it."""

from __future__ import annotations

import os

import pytest

from ludic.envs.code_exec import BubblewrapRunner, SandboxLimits
from ludic.envs.code_exec.group_pool import pool_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the run's cgroup needs root on this host (cgroup v1)")

SPIN_0_6_S = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end:\n    pass\nprint('spun')\n"
TOUCH_600_MB = "b = bytearray(600 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\nprint(len(b))\n"
CHILDREN_HOLD_MEMORY = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        b = bytearray(120 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(5); os._exit(0)
os.wait(); print('survived')
"""


async def test_a_kept_run_group_reads_only_its_own_run(code_dir):
    runner = BubblewrapRunner()
    limits = SandboxLimits(memory_mb=200, cpu_s=1, wall_s=20, max_processes=9)  # limits of this test alone
    kept = pool_for(runner.cgroups)._idle
    spun = await runner.run(code_dir(SPIN_0_6_S), b"", limits, slot=0)
    assert spun.status == "ok" and spun.cpu_s is not None and spun.cpu_s >= 0.55
    assert len(kept[(200 << 20, 9)]) == 1  # the run's group was kept, empty
    oom = await runner.run(code_dir(TOUCH_600_MB), b"", limits, slot=0)
    assert oom.status == "memory_limit"
    for _ in range(3):  # the earlier runs' CPU time and OOM kill are not this run's
        after = await runner.run(code_dir("print(int(input()) + 1)\n"), b"1\n", limits, slot=0)
        assert (after.status, after.stdout) == ("ok", b"2\n") and after.cpu_s is not None and after.cpu_s < 0.4
    assert len(kept[(200 << 20, 9)]) == 1  # one group served every run


async def test_every_process_of_a_run_joins_its_kept_group(code_dir):
    runner = BubblewrapRunner()
    limits = SandboxLimits(memory_mb=256, wall_s=20)
    for _ in range(2):  # 3 x 120 MiB in children: the run's memory, not each process's, is bounded
        outcome = await runner.run(code_dir(CHILDREN_HOLD_MEMORY), b"", limits, slot=0)
        assert outcome.status == "memory_limit"
