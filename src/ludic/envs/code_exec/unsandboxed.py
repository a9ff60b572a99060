"""Running untrusted code WITHOUT a sandbox: only for machines where bubblewrap cannot run, and
only when chosen by name (``runner="unsandboxed"``). The rlimits still apply, but the program sees
the host's files, network and processes."""

from __future__ import annotations

import sys
from pathlib import Path

from ludic.envs.code_exec.bwrap import SANDBOX_ENV
from ludic.envs.code_exec.sandbox import RunOutcome, SandboxLimits, run_limited


class UnsandboxedRunner:
    """``python -I -B solution.py`` with a cleared environment and the rlimits (but, as root, no
    process limit: the kernel does not enforce RLIMIT_NPROC for root)."""

    name = "unsandboxed"

    def __init__(self, *, python: str | None = None) -> None:
        self.python = python or sys.executable

    async def run(self, code_dir: Path, stdin: bytes, limits: SandboxLimits, *, slot: int) -> RunOutcome:
        argv = [self.python, "-I", "-B", str(code_dir / "solution.py")]
        # RLIMIT_NPROC counts this user's other processes too, so it cannot be tight here
        loose = SandboxLimits(**{**vars(limits), "max_processes": 4096})
        return await run_limited(argv, stdin, loose, user=None, env=dict(SANDBOX_ENV))
