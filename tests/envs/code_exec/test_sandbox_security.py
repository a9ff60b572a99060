"""Adversarial programs against the real bubblewrap sandbox: each is contained, reported with a
clear status, and the host is unchanged. Run with ``-rA -s`` to see what the sandbox returned."""

import os
import socket
import textwrap

import pytest

from ludic.envs.code_exec import BubblewrapRunner, CodeExecutor, SandboxLimits, TestCase
from ludic.envs.code_exec.bwrap import BASE_UID

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=1, memory_mb=256, max_processes=8, max_output_bytes=64 * 1024)
POOL = 2


class RecordingRunner:
    """The real sandbox, remembering which uid each run used (to check none of it survives)."""

    name = "bubblewrap"

    def __init__(self) -> None:
        self.inner = BubblewrapRunner()
        self.uids: list[int] = []

    async def run(self, code_dir, stdin, limits, *, slot):
        outcome = await self.inner.run(code_dir, stdin, limits, slot=slot)
        self.uids.append(outcome.uid)
        return outcome


@pytest.fixture(scope="module")
def runner():
    return RecordingRunner()


@pytest.fixture(scope="module")
def executor(runner):
    return CodeExecutor(runner, limits=LIMITS, pool_size=POOL)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A planted secret file, a secret env var and a listening socket, all on the host."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-FILE")
    secret.chmod(0o644)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("LUDIC_TEST_SECRET", "TOP-SECRET-ENV")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    yield {"secret": secret, "port": server.getsockname()[1], "server": server, "pid": os.getpid()}
    server.close()


def _processes_of(uid: int) -> list[int]:
    """Host processes still running under the run's uid (there must be none after the run)."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


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


@pytest.mark.parametrize("case", list(CASES))
async def test_adversarial_program_is_contained(case, executor, runner, host):
    template, expected = CASES[case]
    code = textwrap.dedent(template).format(
        secret=host["secret"], secret_dir=host["secret"].parent, port=host["port"], pid=host["pid"]
    )
    result, _ = await executor.evaluate(code, [TestCase(input="", output="42")])
    (test,) = result.tests
    print(f"\nCASE {case}: status={test.status} stdout={test.stdout_head[:120]!r} stderr={test.stderr_tail[-160:]!r}")
    assert test.status in (expected if isinstance(expected, tuple) else (expected,))
    assert result.pass_rate == 0.0
    # the host is unchanged
    assert host["secret"].read_text() == "TOP-SECRET-FILE"
    assert sorted(p.name for p in host["secret"].parent.iterdir()) == ["secret.txt"]
    assert not os.path.exists("/usr/pwned")
    assert "TOP-SECRET" not in test.stdout_head + test.stderr_tail
    with pytest.raises(BlockingIOError):
        host["server"].accept()  # nobody connected
    uid = runner.uids[-1]
    assert uid >= BASE_UID and _processes_of(uid) == []
    if case == "fork_count":
        assert int(test.stdout_head) < LIMITS.max_processes
    if case == "write_outside_tmp":
        assert test.stdout_head.startswith("['OSError', 'OSError', 'OSError', 'FileNotFoundError', '/tmp/fine']")
