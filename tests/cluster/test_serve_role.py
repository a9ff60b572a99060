"""``ludic serve``: refuses a public bind without a token (before loading anything); on loopback with a token
it serves [model] over Ludic's routes, the token required."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ludic.cli import main
from ludic.cluster.serve_role import is_loopback
from ludic.inference.weight_sync.process_group import free_port
from ludic.testing.run_config import tiny_run_toml
from ludic.testing.tiny_model import tiny_model_path

CLUSTER = """
[cluster]
servers = ["http://10.0.0.5:8000"]
redis_url = "redis://10.0.0.2:6379/0"
api_key_env = "T_SERVE_KEY"
"""


def _config(tmp: Path, model: object = None) -> Path:
    path = tmp / "serve.toml"
    path.write_text(tiny_run_toml(model or tiny_model_path(), steps=1, tables=CLUSTER))
    return path


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "example.org"])
def test_serve_refuses_a_public_bind_without_a_token_and_loads_nothing(
    tmp_path, monkeypatch, capsys, host
) -> None:
    monkeypatch.delenv("T_SERVE_KEY", raising=False)
    config = _config(tmp_path, model=tmp_path / "not-loaded")  # a missing model: the refusal comes first
    (tmp_path / "not-loaded").mkdir()
    assert main(["serve", str(config), "--host", host, "--port", "8999"]) == 2
    err = capsys.readouterr().err
    assert f"--host {host}: refusing to serve on a non-loopback address without a token" in err
    assert "$T_SERVE_KEY" in err


def test_loopback_addresses_are_told_apart_from_public_ones() -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.org", "")] == [False] * 5


@pytest.mark.slow  # a `ludic serve` process: ~9 s
def test_serve_on_loopback_serves_the_model_and_requires_the_token(tmp_path) -> None:
    port = free_port()
    env = {**os.environ, "T_SERVE_KEY": "serve-token", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ludic.cli", "serve", str(_config(tmp_path)), "--host", "127.0.0.1",
           "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        body = {
            "model": "tiny",
            "prompt": [72, 105],
            "max_tokens": 2,
            "return_token_ids": True,
            "logprobs": 0,
        }
        assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 401
        ok = httpx.post(url + "/v1/completions", json=body, timeout=30,
                        headers={"Authorization": "Bearer serve-token"})  # fmt: skip
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) >= 1
        version = httpx.get(
            url + "/policy_version", headers={"Authorization": "Bearer serve-token"}, timeout=5
        )
        assert version.json()["policy_version"] == 0
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert "bearer token required" in out and "serve-token" not in out
