"""Runs programs in the bubblewrap sandbox as whatever (unprivileged) user starts it; a helper of
``test_sandbox_unprivileged.py``, not a test.

stdin: JSON ``{"limits": {...}, "pool": int, "cases": {name: code}}``. stdout: one JSON object with
``uid``, ``is_root`` (which path the runner took), ``bwrap``, ``python`` and, per case, the verdict plus this
uid's processes other than this one left after the run (there must be none).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


def _own_processes() -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if os.stat(entry.path).st_uid == os.getuid():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


async def main() -> None:
    from ludic.envs.code_exec import BubblewrapRunner, CodeExecutor, SandboxLimits, TestCase

    request = json.load(sys.stdin)
    runner = BubblewrapRunner(require_run_limits=request.get("require_run_limits", True))
    executor = CodeExecutor(runner, limits=SandboxLimits(**request["limits"]), pool_size=request["pool"])
    report: dict = {
        "uid": os.getuid(),
        "is_root": runner.is_root,
        "bwrap": runner.bwrap,
        "python": sys.version.split()[0],
        "run_limits": runner.run_limits,
        "cases": {},
    }
    for name, code in request["cases"].items():
        result, _ = await executor.evaluate(code, [TestCase(input="", output="42")])
        (test,) = result.tests
        report["cases"][name] = {
            "status": test.status,
            "stdout": test.stdout_head,
            "stderr": test.stderr_tail,
            "pass_rate": result.pass_rate,
            "leftover": _own_processes(),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
