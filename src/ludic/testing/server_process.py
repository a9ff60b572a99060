"""``python -m ludic.inference.server`` as a real subprocess on loopback, for tests and benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from ludic.inference.weight_sync.process_group import free_port


def start_server(model_dir: str | Path, *args: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server (extra CLI ``args``) and return (process, base URL) once /health answers."""
    port = port or free_port()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "ludic.inference.server", str(model_dir), "--port", str(port), *args]
    # The log goes to a temporary file, not a pipe nobody drains: a full pipe would stall the server.
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop_server)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            out = log.read().decode(errors="replace")[-2000:]
            stop_server(proc)
            raise RuntimeError(f"server did not start: {out}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = getattr(proc, "log", None)
    if log is not None:
        log.close()


@contextmanager
def running_server(model_dir: str | Path, args: Sequence[str] = (), port: int | None = None) -> Iterator[str]:
    """Context manager: the server's base URL while it runs; stopped on exit."""
    proc, url = start_server(model_dir, *args, port=port)
    try:
        yield url
    finally:
        stop_server(proc)


def start_servers(model_dir: str | Path, n: int, *args: str) -> tuple[list[subprocess.Popen], list[str]]:
    """``n`` servers of ``model_dir`` started side by side (each takes seconds to load): processes, URLs."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        started = list(pool.map(lambda _: start_server(model_dir, *args), range(n)))
    return [p for p, _ in started], [u for _, u in started]
