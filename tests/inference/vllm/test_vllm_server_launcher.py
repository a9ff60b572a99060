"""The vllm serve launcher: the command line and environment it builds, and its health wait (on Ludic's server)."""

from __future__ import annotations

import json
import sys

import pytest

from ludic.inference.vllm.launcher import (
    start_vllm_server,
    vllm_serve_command,
    vllm_serve_env,
    wait_for_vllm_health,
)
from ludic.inference.weight_sync.process_group import free_port
from ludic.testing import tiny_model_path


def test_the_command_turns_on_weight_transfer_and_processed_logprobs():
    cmd = vllm_serve_command("Qwen/Qwen2.5-7B-Instruct", port=8123, dtype="bfloat16", extra_args=["--seed", "1"])
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123" and flags["--dtype"] == "bfloat16"
    assert json.loads(flags["--weight-transfer-config"]) == {"backend": "nccl"}
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--seed"] == "1"
    env = vllm_serve_env("tok", base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": "tok"}
    assert "tok" not in cmd  # the token stays off the command line


@pytest.mark.slow
def test_start_waits_for_health_and_stop_ends_the_process():
    port = free_port()
    ludic = [sys.executable, "-m", "ludic.inference.server", str(tiny_model_path()), "--port", str(port)]
    server = start_vllm_server("tiny", port=port, command=ludic, timeout_s=120)
    try:
        wait_for_vllm_health(server.base_url, timeout_s=1)  # already healthy: returns at once
    finally:
        server.stop()
    assert server.proc.returncode is not None


def test_a_server_that_dies_or_never_answers_is_a_clear_error():
    with pytest.raises(RuntimeError, match="exited with code 3"):
        start_vllm_server("x", port=free_port(), command=[sys.executable, "-c", "raise SystemExit(3)"], timeout_s=30)
    with pytest.raises(TimeoutError, match=r"did not answer 200 within 0\.5s"):
        wait_for_vllm_health(f"http://127.0.0.1:{free_port()}", timeout_s=0.5, poll_s=0.1)
