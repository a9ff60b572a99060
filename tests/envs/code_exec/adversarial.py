"""The adversarial programs and the host checks shared by the root and the unprivileged sandbox tests."""

from __future__ import annotations

import os
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ludic.envs.code_exec import SandboxLimits

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=1, memory_mb=256, max_processes=8, max_output_bytes=64 * 1024)
POOL = 2

CASES = {
    "infinite_loop": ("while True:\n    pass\n", "timeout"),
    "fork_bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "timeout",
    ),
    "fork_count": (
        """
        import os, time
        n = 0
        for _ in range(1000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
        print(n)
        """,
        "wrong_answer",
    ),
    "alloc_10gb": ("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n", "memory_limit"),
    "print_100mb": ("import sys\nsys.stdout.write('x' * (100 * 1024 * 1024))\n", "output_limit"),
    "write_outside_tmp": (
        """
        ok = []
        for path in ["/usr/pwned", "/code/pwned", "/code/solution.py", "{secret_dir}/pwned", "/tmp/fine"]:
            try:
                with open(path, "w") as f:
                    f.write("x")
                ok.append(path)
            except OSError as exc:
                ok.append(type(exc).__name__)
        print(ok)
        """,
        "wrong_answer",
    ),
    "read_planted_file": ("print(open('{secret}').read())\n", "runtime_error"),
    "read_parent_env": (
        """
        import os
        seen = dict(os.environ)
        for pid in ("1", "2", "self"):
            try:
                seen[pid] = open(f"/proc/{{pid}}/environ").read()
            except OSError as exc:
                seen[pid] = type(exc).__name__
        print(seen)
        """,
        "wrong_answer",
    ),
    "network": (
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n",
        "runtime_error",
    ),
    "kill_parent": (
        """
        import os, signal
        for pid in (os.getppid(), {pid}, 1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                print(pid, type(exc).__name__)
        os.kill(-1, signal.SIGKILL)
        """,
        ("killed", "wrong_answer", "runtime_error"),
    ),
    "hack_exit_0_early": ("import sys\nsys.exit(0)\n", "wrong_answer"),
    "hack_override_eq": (
        """
        class Always(str):
            def __eq__(self, other):
                return True
            __hash__ = str.__hash__
        import builtins
        builtins.str = Always
        print(Always("anything"))
        """,
        "wrong_answer",
    ),
}


def plant_host(tmp_path: Path) -> dict[str, Any]:
    """A secret file (world-readable, in a world-readable dir) and a listening socket on the host."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-FILE")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    return {"secret": secret, "port": server.getsockname()[1], "server": server, "pid": os.getpid()}


def case_code(case: str, host: dict[str, Any]) -> str:
    template, _ = CASES[case]
    return textwrap.dedent(template).format(
        secret=host["secret"], secret_dir=host["secret"].parent, port=host["port"], pid=host["pid"]
    )


def processes_of(uid: int) -> list[int]:
    """Host processes running under ``uid``."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def check_contained(case: str, status: str, stdout: str, stderr: str, pass_rate: float, host: dict[str, Any]) -> None:
    """The run got its expected status, passed nothing, and the host is unchanged."""
    _, expected = CASES[case]
    print(f"\nCASE {case}: status={status} stdout={stdout[:120]!r} stderr={stderr[-160:]!r}")
    assert status in (expected if isinstance(expected, tuple) else (expected,))
    assert pass_rate == 0.0
    assert host["secret"].read_text() == "TOP-SECRET-FILE"
    assert sorted(p.name for p in host["secret"].parent.iterdir()) == ["secret.txt"]
    assert not os.path.exists("/usr/pwned")
    assert "TOP-SECRET" not in stdout + stderr
    with pytest.raises(BlockingIOError):
        host["server"].accept()  # nobody connected
    if case == "fork_count":
        assert int(stdout) < LIMITS.max_processes
    if case == "write_outside_tmp":
        assert stdout.startswith("['OSError', 'OSError', 'OSError', 'FileNotFoundError', '/tmp/fine']")
