"""The redis-server Ludic starts dies with the process that started it, even when that one is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PARENT = """
import sys, time
from ludic.training.pipeline.redis_server import RedisServer
server = RedisServer(data_dir=sys.argv[1]).start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_redis_server_exits_when_its_parent_is_sigkilled(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "redis")], stdout=subprocess.PIPE
    )
    redis_pid = None
    try:
        redis_pid = int(parent.stdout.readline())
        assert _alive(redis_pid)
        parent.send_signal(signal.SIGKILL)  # no atexit, no finally: only the kernel can tell redis
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _alive(redis_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(redis_pid), f"redis-server {redis_pid} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if redis_pid is not None and _alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
        parent.stdout.close()
