"""``--dry-run`` of a ``ludic train`` on backend "server": the server must serve the policy version the run
starts from (0 fresh, the latest checkpoint's step on resume), else the run would sample an earlier run's
weights and die at its first publish."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ludic.cli.server_version import server_version_errors, start_version
from ludic.config import parse_config


@pytest.fixture
def served() -> Iterator[tuple[str, dict]]:
    """A loopback HTTP server answering ``/policy_version`` with ``state["version"]``."""
    state = {"version": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"policy_version": state["version"]}).encode()
            self.send_response(200 if self.path == "/policy_version" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def _cfg(url: str, out: Path, steps: int = 2):
    return parse_config({
        "steps": steps, "model": {"path": "m"}, "env": {"name": "letter_repeat"},
        "inference": {"backend": "server", "server_url": url}, "logging": {"output_dir": str(out)},
    })  # fmt: skip


def test_a_fresh_run_needs_version_0_and_a_resume_its_checkpoints_step(tmp_path: Path, served) -> None:
    url, state = served
    cfg = _cfg(url, tmp_path / "out")
    assert server_version_errors(cfg) == []
    state["version"] = 2
    (error,) = server_version_errors(cfg)
    assert f"{url} serves policy_version 2, published by an earlier run, and this run starts fresh" in error
    assert "(version 1) would be refused" in error and "restart the server" in error

    (tmp_path / "out" / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "step_000001").mkdir()
    assert start_version(cfg) == 2
    assert server_version_errors(cfg) == []  # resumes at step 2: the server holds its weights
    state["version"] = 3
    (error,) = server_version_errors(cfg)
    assert "this run resumes at step 2" in error and "(version 2) would be refused" in error
    assert server_version_errors(_cfg(url, tmp_path / "out", steps=0)) == []  # publishes nothing


def test_a_server_not_up_yet_is_left_to_the_run(tmp_path: Path) -> None:
    assert server_version_errors(_cfg("http://127.0.0.1:9", tmp_path / "out")) == []
