"""Sandboxed code execution speed, side by side in one run.

For a trivial program (``print(int(input()) + 1)``):
1. one run at a time: a bare ``python -I -B solution.py`` subprocess (same rlimits, no sandbox) vs
   the bubblewrap sandbox with everything on (new namespaces, read-only root, the bounded scratch
   tmpfs, seccomp, the run's cgroup, unprivileged uid, sweep of the uid's processes) vs the same
   without the cgroup (``require_run_limits=False`` on a host made to offer none): runs/s and the
   sandbox's overhead per run in ms;
2. throughput through a ``CodeExecutor`` with pool size 1, 2 and 4 (cache off: distinct inputs).
Variants are interleaved round by round and medians reported; the machine may be shared.

Run: ``.venv/bin/python bench/bench_code_exec.py [--rounds 5 --runs 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from ludic.envs.code_exec import BubblewrapRunner, CodeExecutor, SandboxLimits, TestCase
from ludic.envs.code_exec.bwrap import SANDBOX_ENV, default_python
from ludic.envs.code_exec.sandbox import run_limited

CODE = "print(int(input()) + 1)\n"


async def bare_runs(code_dir: Path, n: int, limits: SandboxLimits) -> float:
    argv = [default_python(), "-I", "-B", str(code_dir / "solution.py")]
    loose = SandboxLimits(**{**vars(limits), "max_processes": 4096})
    started = time.perf_counter()
    for i in range(n):
        out = await run_limited(argv, f"{i}\n".encode(), loose, user=None, env=dict(SANDBOX_ENV))
        assert out.stdout.strip() == str(i + 1).encode(), out
    return (time.perf_counter() - started) / n


async def sandbox_runs(runner: BubblewrapRunner, code_dir: Path, n: int, limits: SandboxLimits) -> float:
    started = time.perf_counter()
    for i in range(n):
        out = await runner.run(code_dir, f"{i}\n".encode(), limits, slot=0)
        assert out.stdout.strip() == str(i + 1).encode(), out
    return (time.perf_counter() - started) / n


async def pooled_runs(runner: BubblewrapRunner, pool: int, n: int, offset: int) -> float:
    executor = CodeExecutor(runner, pool_size=pool)
    tests = [TestCase(f"{offset + i}\n", str(offset + i + 1)) for i in range(n)]
    started = time.perf_counter()
    result, _ = await executor.evaluate(CODE, tests)
    assert result.all_passed, result
    return n / (time.perf_counter() - started)


async def main(rounds: int, runs: int) -> None:
    limits = SandboxLimits()
    runner = BubblewrapRunner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        no_cgroup = BubblewrapRunner(cgroup_root=Path("/nonexistent"), require_run_limits=False)
    bare, boxed, unbounded, pooled = [], [], [], {1: [], 2: [], 4: []}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        (Path(tmp) / "solution.py").write_text(CODE)
        (Path(tmp) / "solution.py").chmod(0o644)
        for r in range(rounds):
            bare.append(await bare_runs(Path(tmp), runs, limits))
            boxed.append(await sandbox_runs(runner, Path(tmp), runs, limits))
            unbounded.append(await sandbox_runs(no_cgroup, Path(tmp), runs, limits))
            for pool in pooled:
                pooled[pool].append(await pooled_runs(runner, pool, runs, offset=r * 1000 + pool * 100))
    b, s, u = statistics.median(bare), statistics.median(boxed), statistics.median(unbounded)
    print(f"machine: {os.cpu_count()} CPUs (shared with other work; compare ratios), python {sys.version.split()[0]}")
    print(f"run limits      : {runner.run_limits}")
    print(f"bare subprocess : {1 / b:7.1f} runs/s ({b * 1e3:6.1f} ms/run)")
    print(f"bubblewrap      : {1 / s:7.1f} runs/s ({s * 1e3:6.1f} ms/run); overhead {(s - b) * 1e3:.1f} ms/run, "
          f"{s / b:.2f}x the bare run")  # fmt: skip
    print(f"  without cgroup: {1 / u:7.1f} runs/s ({u * 1e3:6.1f} ms/run); the run's cgroup costs {(s - u) * 1e3:.1f} ms/run")
    for pool, values in pooled.items():
        print(f"executor pool {pool}: {statistics.median(values):7.1f} runs/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.runs))
