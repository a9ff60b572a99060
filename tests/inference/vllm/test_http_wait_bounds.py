"""Each inference HTTP call is bounded, retries included: a server that accepts the connection, reads the
request and never answers makes the call fail within its bound with ``ServerTimeout`` (a ``WaitTimeout``),
naming the server, the route and the time waited. Before the bound, such a call waited httpx's timeout once
per attempt (4 attempts) and then raised an error that named neither the wait nor the bound."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from ludic.inference import VLLMChatClient
from ludic.inference.http_client import ServerError, ServerTimeout
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.timeouts import WaitTimeout

BOUND_S = 1.0
SLACK_S = 0.6


class StallingServer:
    """A loopback TCP server that accepts every connection, reads what is sent and never replies."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.received = bytearray()
        self._conns: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self._closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                pass
            else:
                conn.settimeout(0.05)
                self._conns.append(conn)
                self.accepted += 1
            for conn in self._conns:
                with contextlib.suppress(TimeoutError, OSError):
                    self.received += conn.recv(65536)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self.sock.close()


@pytest.fixture
def stalling() -> Iterator[StallingServer]:
    server = StallingServer()
    yield server
    server.close()


def _client(port: int, **kw: object) -> VLLMChatClient:
    return VLLMChatClient(base_url=f"http://127.0.0.1:{port}", timeout_s=BOUND_S, retries=3, backoff_s=0.05, **kw)


def _check(err: WaitTimeout, port: int, route: str, started: float) -> None:
    waited = time.monotonic() - started
    assert isinstance(err, ServerTimeout) and isinstance(err, ServerError) and err.status is None
    assert err.peer == f"http://127.0.0.1:{port}"
    assert route in err.operation
    assert BOUND_S - 0.05 <= err.waited_s <= BOUND_S + SLACK_S
    assert waited <= BOUND_S + SLACK_S, f"the call took {waited:.2f} s, bound {BOUND_S} s"
    assert f"no answer from http://127.0.0.1:{port}" in str(err) and "bound 1 s" in str(err)


@pytest.mark.timeout(30)
def test_a_generation_to_a_stalled_server_fails_within_its_bound_naming_server_and_route(stalling) -> None:
    client = _client(stalling.port)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                    sampling=SamplingConfig(max_tokens=4), prompt_token_ids=[1, 2, 3])  # fmt: skip

    async def go() -> None:
        try:
            await client.complete(request)
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        asyncio.run(go())
    _check(info.value, stalling.port, "/v1/completions", started)
    assert b"POST /v1/completions" in stalling.received  # the request did reach the server


@pytest.mark.timeout(30)
def test_a_version_query_to_a_stalled_server_fails_within_its_bound(stalling) -> None:
    client = _client(stalling.port)

    async def go() -> int:
        try:
            return await client.get_policy_version()
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        asyncio.run(go())
    _check(info.value, stalling.port, "/policy_version", started)


@pytest.mark.timeout(30)
def test_a_blocking_control_call_with_retries_fails_within_its_bound(stalling) -> None:
    client = _client(stalling.port)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        client.post_json_sync("/resume", {}, retry=True)
    _check(info.value, stalling.port, "/resume", started)
    client.sync_client().close()


@pytest.mark.timeout(30)
def test_a_weight_upload_to_a_stalled_server_fails_within_the_publish_bound(stalling) -> None:
    client = _client(stalling.port, enable_weight_updates=True)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        client.sync_weights({"w": torch.zeros(4)}, timeout_s=BOUND_S, version=3)
    _check(info.value, stalling.port, "/ludic/update_weights_blob", started)
    client.sync_client().close()


@pytest.mark.timeout(30)
def test_a_refused_connection_still_fails_fast_as_unreachable_not_as_a_timeout() -> None:
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()  # nothing listens there now
    client = _client(free)
    started = time.monotonic()
    with pytest.raises(ServerError, match="could not reach the server after 4 attempt") as info:
        client.get_json_sync("/health")
    assert not isinstance(info.value, WaitTimeout)
    assert time.monotonic() - started < BOUND_S
    client.sync_client().close()
