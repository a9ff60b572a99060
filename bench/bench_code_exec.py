"""Sandboxed code execution speed, side by side in one run.

For a trivial program (``print(int(input()) + 1)``):
1. one run at a time: a bare ``python -I -B solution.py`` subprocess (same rlimits, no sandbox) vs
   the bubblewrap sandbox with everything on (new namespaces, read-only root, the bounded scratch
   tmpfs, seccomp, the run's cgroup, unprivileged uid, sweep of the uid's processes) vs the same
   without the cgroup (``require_run_limits=False`` on a host made to offer none): runs/s and the
   sandbox's overhead per run in ms;
2. throughput through a ``CodeExecutor`` with pool size 1, 2 and 4 (cache off: distinct inputs).
Variants are interleaved round by round and medians reported; the machine may be shared.
``--against REV`` adds git revision REV's sandbox (its ``BubblewrapRunner`` and ``CodeExecutor``, loaded
from ``git show`` as a package of their own) to every round, one at a time and through the default pool,
and prints this checkout's rates over REV's.

Run: ``.venv/bin/python bench/bench_code_exec.py [--rounds 5 --runs 20] [--against 7cdc8d2~1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import subprocess
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


async def paired_runs(now: BubblewrapRunner, rev: object, code_dir: Path, n: int,
                      rev_limits: object) -> tuple[list[float], list[float]]:  # fmt: skip
    """Seconds per run of ``now`` and ``rev`` (with its own default limits), alternating run by run."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(n):
        for runner, limits, out_times in ((now, SandboxLimits(), times[0]), (rev, rev_limits, times[1])):
            started = time.perf_counter()
            out = await runner.run(code_dir, f"{i}\n".encode(), limits, slot=0)
            out_times.append(time.perf_counter() - started)
            assert out.stdout.strip() == str(i + 1).encode(), out
    return times


async def pooled_runs(runner: BubblewrapRunner, pool: int, n: int, offset: int) -> float:
    executor = CodeExecutor(runner, pool_size=pool)
    tests = [TestCase(f"{offset + i}\n", str(offset + i + 1)) for i in range(n)]
    started = time.perf_counter()
    result, _ = await executor.evaluate(CODE, tests)
    assert result.all_passed, result
    return n / (time.perf_counter() - started)


def code_exec_at(rev: str) -> tuple[object, object]:
    """Revision ``rev``'s ``bwrap`` and ``executor`` modules, imported as package ``code_exec_at_rev``
    (its own modules' imports of each other rewritten to it; the rest of ``ludic`` is this checkout's)."""
    root = Path(__file__).resolve().parent.parent
    folder = "src/ludic/envs/code_exec"
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", f"{rev}:{folder}"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    pkg = Path(tempfile.mkdtemp(prefix="ludic-bench-rev-")) / "code_exec_at_rev"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in listed:
        if name.endswith(".py") and name not in ("__init__.py", "env.py"):
            text = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{folder}/{name}"],
                                  capture_output=True, text=True, check=True).stdout  # fmt: skip
            (pkg / name).write_text(text.replace("ludic.envs.code_exec.", "code_exec_at_rev."))
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("code_exec_at_rev.bwrap"), importlib.import_module("code_exec_at_rev.executor")


async def rev_pooled_runs(rev_mods: tuple, n: int, offset: int) -> float:
    """Throughput of the revision's executor at its default pool size (cache off: distinct inputs)."""
    bwrap, executor = rev_mods
    ex = executor.CodeExecutor(bwrap.BubblewrapRunner())
    tests = [executor.TestCase(f"{offset + i}\n", str(offset + i + 1)) for i in range(n)]
    started = time.perf_counter()
    result, _ = await ex.evaluate(CODE, tests)
    assert result.all_passed, result
    return n / (time.perf_counter() - started)


async def main(rounds: int, runs: int, against: str | None) -> None:
    limits = SandboxLimits()
    runner = BubblewrapRunner()
    rev_mods = code_exec_at(against) if against else None
    rev_runner = rev_mods[0].BubblewrapRunner() if rev_mods else None
    paired_now: list[float] = []
    paired_rev: list[float] = []
    rev_pooled: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        no_cgroup = BubblewrapRunner(cgroup_root=Path("/nonexistent"), require_run_limits=False)
    bare, boxed, unbounded, pooled = [], [], [], {1: [], 2: [], 4: []}
    default_pool = pooled[CodeExecutor(runner).pool_size]  # the executor's default pool size is among these
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        (Path(tmp) / "solution.py").write_text(CODE)
        (Path(tmp) / "solution.py").chmod(0o644)
        for r in range(rounds):
            bare.append(await bare_runs(Path(tmp), runs, limits))
            boxed.append(await sandbox_runs(runner, Path(tmp), runs, limits))
            if rev_mods is not None:  # run by run, alternating, so both see the same load
                now_times, rev_times = await paired_runs(runner, rev_runner, Path(tmp), runs, rev_mods[0].SandboxLimits())
                paired_now.extend(now_times)
                paired_rev.extend(rev_times)
            unbounded.append(await sandbox_runs(no_cgroup, Path(tmp), runs, limits))
            for pool in pooled:
                pooled[pool].append(await pooled_runs(runner, pool, runs, offset=r * 1000 + pool * 100))
            if rev_mods is not None:
                rev_pooled.append(await rev_pooled_runs(rev_mods, runs, offset=r * 1000 + 500))
    b, s, u = statistics.median(bare), statistics.median(boxed), statistics.median(unbounded)
    print(f"machine: {os.cpu_count()} CPUs (shared with other work; compare ratios), python {sys.version.split()[0]}")
    print(f"run limits      : {runner.run_limits}")
    print(f"bare subprocess : {1 / b:7.1f} runs/s ({b * 1e3:6.1f} ms/run)")
    print(f"bubblewrap      : {1 / s:7.1f} runs/s ({s * 1e3:6.1f} ms/run); overhead {(s - b) * 1e3:.1f} ms/run, "
          f"{s / b:.2f}x the bare run")  # fmt: skip
    print(f"  without cgroup: {1 / u:7.1f} runs/s ({u * 1e3:6.1f} ms/run); the run's cgroup costs {(s - u) * 1e3:.1f} ms/run")
    for pool, values in pooled.items():
        print(f"executor pool {pool}: {statistics.median(values):7.1f} runs/s")
    if against:
        n, o = statistics.median(paired_now), statistics.median(paired_rev)
        p_now, p_rev = statistics.median(default_pool), statistics.median(rev_pooled)
        one = statistics.median(old / new for old, new in zip(paired_rev, paired_now, strict=True))
        pool = statistics.median(new / old for new, old in zip(default_pool, rev_pooled, strict=True))
        print(f"one at a time, alternating run by run, now vs {against}: {1 / n:7.1f} vs {1 / o:7.1f} runs/s "
              f"({n * 1e3:.1f} vs {o * 1e3:.1f} ms/run): {o / n:.2f}x (median of paired ratios {one:.2f}x)")  # fmt: skip
        print(f"default pool, now vs {against}: {p_now:7.1f} vs {p_rev:7.1f} runs/s: {p_now / p_rev:.2f}x "
              f"(median of per-round ratios {pool:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--against", default=None, help="also run this git revision's sandbox, interleaved")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.runs, args.against))
