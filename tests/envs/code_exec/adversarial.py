"""The adversarial programs and the host checks shared by the root and the unprivileged sandbox tests."""

from __future__ import annotations

import ast
import errno
import os
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ludic.envs.code_exec import SandboxLimits
from ludic.envs.code_exec.uids import pids_of

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
    "alloc_10gb": ("x = b'x' * (10 * 1024 ** 3)\nprint(len(x))\n", "memory_limit"),
    "children_hold_memory": (  # each child under memory_mb, together far over it
        """
        import os, time
        for _ in range(5):
            if os.fork() == 0:
                block = bytearray(200 * 1024 * 1024)
                block[::4096] = b"x" * len(block[::4096])
                time.sleep(2)
                os._exit(0)
        time.sleep(1.5)
        print("alive")
        """,
        "memory_limit",
    ),
    "fill_writable_mounts": (  # only /tmp and /dev/shm are writable, both the one bounded tmpfs
        """
        written = {{}}
        for path in ["/dev/shm/shm", "/root_fill", "/dev/dev_fill", "/tmp/tmp"]:
            size, error = 0, None
            try:
                for i in range(8):  # 8 files of 8 MiB (each under RLIMIT_FSIZE)
                    with open(f"{{path}}{{i}}", "wb", buffering=0) as f:
                        for _ in range(8):
                            size += f.write(b"x" * (1 << 20))
            except OSError as exc:
                error = exc.errno
            written[path] = (size, error)
        print(written)
        """,
        "wrong_answer",
    ),
    "many_empty_files": (
        """
        n = 0
        try:
            for n in range(175_000):
                open(f"/tmp/{{n}}", "w").close()
        except OSError as exc:
            print(n, exc.errno)
        """,
        "wrong_answer",
    ),
    "denied_syscalls": (
        """
        import ctypes, errno, socket
        libc = ctypes.CDLL(None, use_errno=True)
        def call(nr, *args):
            ret = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
            return errno.errorcode.get(ctypes.get_errno(), "?") if ret == -1 else "ok"
        seen = {{"unshare": call(272, 0x10000000 | 0x20000), "io_uring_setup": call(425, 1, 0),
                "add_key": call(248, 0, 0, 0, 0, 0), "ptrace": call(101, 0x4206, 1, 0, 0),
                "mount": call(165, 0, 0, 0, 0, 0), "keyctl": call(250, 0, 0, 0, 0, 0)}}
        try:
            socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
            seen["vsock"] = "ok"
        except OSError as exc:
            seen["vsock"] = errno.errorcode[exc.errno]
        print(seen)
        """,
        "wrong_answer",
    ),
    "fake_memory_error": ("import sys\nsys.stderr.write('MemoryError\\n')\nsys.exit(3)\n", "runtime_error"),
    "fake_cpu_limit_exit": ("import os\nos._exit(152)\n", "runtime_error"),
    "terminal_escapes": (
        "import sys\nprint('\\x1b[2J\\x1b]0;pwned\\x07hi')\nsys.stderr.write('\\x1b[31mred\\x9b')\n",
        "wrong_answer",
    ),
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
        ("wrong_answer", "runtime_error"),
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


DEGRADED = {
    "alloc_10gb": "runtime_error",  # RLIMIT_AS: a MemoryError the parent cannot tell from a program's own
    "infinite_loop": ("timeout", "runtime_error"),  # SIGXCPU reads as exit 152 unless the wall limit came first
    "fork_bomb": ("timeout", "runtime_error"),
    "children_hold_memory": ("wrong_answer", "runtime_error"),  # no run-wide memory limit
}
"""Where no cgroup bounds the run (``require_run_limits=False``), these statuses replace the CASES'."""


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


processes_of = pids_of  # host processes running under a uid: the sandbox's own helper, not a copy


def check_contained(
    case: str, status: str, stdout: str, stderr: str, pass_rate: float, host: dict[str, Any], *, degraded: bool = False
) -> None:
    """The run got its expected status, passed nothing, and the host is unchanged."""
    _, expected = CASES[case]
    if degraded:
        expected = DEGRADED.get(case, expected)
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
    assert not any(ch in stdout + stderr for ch in "\x1b\x07\x9b")  # control characters escaped
    if case == "terminal_escapes":
        assert stdout.startswith("\\x1b[2J\\x1b]0;pwned\\x07hi") and stderr == "\\x1b[31mred\\x9b"
    if case == "fill_writable_mounts":  # 16 MiB in all: /dev/shm and /tmp are one tmpfs
        written = ast.literal_eval(stdout)
        assert written["/root_fill"] == (0, errno.EROFS) and written["/dev/dev_fill"] == (0, errno.EROFS)
        shm, tmp = written["/dev/shm/shm"], written["/tmp/tmp"]
        assert shm[0] + tmp[0] <= LIMITS.tmp_size_mb << 20 and shm[1] in (errno.EFBIG, errno.ENOSPC)
    if case == "many_empty_files":
        count, code = stdout.split()
        assert int(count) < LIMITS.tmp_max_files and int(code) == errno.ENOSPC
    if case == "denied_syscalls":
        assert ast.literal_eval(stdout) == dict.fromkeys(
            ["unshare", "io_uring_setup", "add_key", "ptrace", "mount", "keyctl", "vsock"], "EPERM"
        )
    if case == "write_outside_tmp":
        assert stdout.startswith("['OSError', 'OSError', 'OSError', 'FileNotFoundError', '/tmp/fine']")
