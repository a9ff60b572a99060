"""Start ``vllm serve`` for RL with Ludic: the weight-transfer API on, processed log-probs, a token.

    python -m ludic.inference.vllm.launcher --model Qwen/Qwen2.5-7B-Instruct --port 8000 --dtype bfloat16

``vllm_serve_command`` builds the command line: ``--weight-transfer-config '{"backend": "nccl"}'``
(the routes ``BroadcastPolicyPublisher`` drives), ``--logprobs-mode processed_logprobs``
(log-probs of the distribution actually sampled, after temperature and top-p), and the
environment ``VLLM_SERVER_DEV_MODE=1`` (which exposes those routes) plus ``VLLM_API_KEY`` when a
token is given (kept off the command line, where ``ps`` would show it). ``start_vllm_server``
launches it as a subprocess and ``wait_for_vllm_health`` polls ``/health``. vLLM itself is not a
dependency: the ``vllm`` executable must be on PATH (``pip install vllm`` on a CUDA machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx


def vllm_serve_command(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "auto",
    weight_transfer_backend: str = "nccl",
    logprobs_mode: str = "processed_logprobs",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``vllm serve`` command line for an RL inference server."""
    return [
        "vllm", "serve", model, "--host", host, "--port", str(port), "--dtype", dtype,
        "--weight-transfer-config", json.dumps({"backend": weight_transfer_backend}),
        "--logprobs-mode", logprobs_mode, *extra_args,
    ]  # fmt: skip


def vllm_serve_env(api_key: str | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for it: the dev-mode routes on, and the bearer token if any."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


@dataclass
class ServerProcess:
    """A started server: its process and base URL; ``stop()`` ends it."""

    proc: subprocess.Popen
    base_url: str

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for_vllm_health(
    base_url: str, *, timeout_s: float = 900.0, proc: subprocess.Popen | None = None, poll_s: float = 0.5
) -> None:
    """Poll ``GET /health`` until it answers 200; RuntimeError if ``proc`` exits first, TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base_url.rstrip("/") + "/health", timeout=min(5.0, poll_s * 4)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server process exited with code {proc.returncode} before {base_url} was healthy")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base_url}/health did not answer 200 within {timeout_s:g}s")
        time.sleep(poll_s)


def start_vllm_server(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "auto",
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
    command: Sequence[str] | None = None,
    wait: bool = True,
    timeout_s: float = 900.0,
) -> ServerProcess:
    """Launch ``vllm serve`` (or ``command``, e.g. Ludic's own server) and wait until it is healthy."""
    cmd = list(command) if command is not None else vllm_serve_command(
        model, host=host, port=port, dtype=dtype, extra_args=extra_args
    )
    if command is None and shutil.which("vllm") is None:
        raise FileNotFoundError("`vllm` is not on PATH: install the vllm extra on a CUDA machine (pip install vllm)")
    proc = subprocess.Popen(cmd, env=vllm_serve_env(api_key))
    server = ServerProcess(proc, f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}")
    if wait:
        try:
            wait_for_vllm_health(server.base_url, timeout_s=timeout_s, proc=proc)
        except BaseException:
            server.stop()
            raise
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Start vllm serve for RL with Ludic (see the module docstring).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--api-key", default=os.environ.get("LUDIC_API_KEY"))
    args, extra = parser.parse_known_args(argv)
    server = start_vllm_server(args.model, host=args.host, port=args.port, dtype=args.dtype,
                               api_key=args.api_key, extra_args=extra)  # fmt: skip
    print(f"vllm serve is up at {server.base_url}", flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
