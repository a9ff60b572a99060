"""One HTTP layer (httpx) for the blocking and async paths: retries with backoff, errors that keep their class.

Connection errors, timeouts and 5xx are retried with exponential backoff (``retries`` times);
a 4xx is the server refusing the request and raises ``RequestRefused`` (a ValueError) at once with
the server's status and message; a 5xx left after the retries raises ``ServerError`` with both.

A bound (``bound_s``, ``[timeouts].http_s`` / ``publish_s``) covers the whole call, its retries and backoff
included: past it the call raises ``ServerTimeout`` (a ``ludic.timeouts.WaitTimeout`` and a status-less
``ServerError``) naming the server, the route and the time waited. The async path enforces it exactly
(``asyncio.timeout``); the blocking path gives each attempt what is left as httpx's timeout, which bounds a
server that accepts and sends nothing (httpx's timeouts are per read, so a server trickling bytes is not cut).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ludic.timeouts import WaitTimeout


class ServerError(RuntimeError):
    """The server failed (5xx) or could not be reached; the message says which and what it said."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerTimeout(WaitTimeout, ServerError):
    """An HTTP call ran past its bound: a ``WaitTimeout`` (peer, operation, waited_s) and a ``ServerError``
    without a status (the server did not answer), so code that marks unreachable servers treats it as one."""

    status = None


class RequestRefused(ValueError):
    """The server refused the request (4xx); the message is the server's."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def server_message(reply: httpx.Response) -> str:
    try:
        payload = reply.json()
    except ValueError:
        return reply.text[:500] or reply.reason_phrase
    if isinstance(payload, dict):
        err = payload.get("error", payload.get("detail", payload))
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(payload)


def checked_json(reply: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON of a 2xx reply; a 4xx/5xx raises with the status and the server's message."""
    if 400 <= reply.status_code < 500:
        raise RequestRefused(f"{what} -> HTTP {reply.status_code}: {server_message(reply)}", reply.status_code)
    if reply.status_code >= 500:
        raise ServerError(f"{what} -> HTTP {reply.status_code}: {server_message(reply)}", reply.status_code)
    try:
        payload = reply.json()
    except ValueError:
        raise ServerError(f"{what} -> HTTP {reply.status_code} but the body is not JSON: {reply.text[:200]!r}") from None
    if not isinstance(payload, dict):
        raise ServerError(f"{what} -> expected a JSON object, got {type(payload).__name__}")
    return payload


def _retryable(exc: Exception) -> bool:
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, ServerError) and exc.status is not None)


class RetryPolicy:
    """``retries`` extra attempts after the first, sleeping ``backoff_s * 2**i`` between them."""

    def __init__(self, retries: int = 3, backoff_s: float = 0.5) -> None:
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got {retries}, {backoff_s}")
        self.retries, self.backoff_s = retries, backoff_s

    def _give_up(self, exc: Exception, what: str, attempts: int) -> Exception:
        if isinstance(exc, httpx.TransportError):
            return ServerError(f"{what}: could not reach the server after {attempts} attempt(s): "
                               f"{type(exc).__name__}: {exc}")  # fmt: skip
        return exc

    def _timed_out(self, peer: str, what: str, started: float, bound_s: float, attempts: int) -> ServerTimeout:
        return ServerTimeout(peer=peer, operation=f"HTTP {what}", waited_s=time.monotonic() - started,
                             bound_s=bound_s, detail=f"{attempts} attempt(s)")  # fmt: skip

    def call(
        self, send: Callable[[float | None], httpx.Response], what: str, retry: bool = True, *,
        bound_s: float | None = None, peer: str = "the server",
    ) -> dict[str, Any]:  # fmt: skip
        """``checked_json(send(timeout))``, retried; ``timeout`` is what is left of ``bound_s`` (None: unbounded)."""
        attempts = self.retries + 1 if retry else 1
        started = time.monotonic()
        for i in range(attempts):
            left = None if bound_s is None else bound_s - (time.monotonic() - started)
            try:
                return checked_json(send(left), what)
            except (httpx.TransportError, ServerError) as exc:
                out_of_time = bound_s is not None and time.monotonic() - started >= bound_s - 1e-3
                if isinstance(exc, httpx.TimeoutException) and bound_s is not None and (out_of_time or i == attempts - 1):
                    raise self._timed_out(peer, what, started, bound_s, i + 1) from exc
                if not _retryable(exc) or i == attempts - 1 or out_of_time:
                    raise self._give_up(exc, what, i + 1) from exc
            pause = self.backoff_s * 2**i
            if bound_s is not None:
                pause = min(pause, max(bound_s - (time.monotonic() - started) - 1e-3, 0.0))
            time.sleep(pause)
        raise AssertionError("unreachable")

    async def acall(
        self, send: Callable[[], Awaitable[httpx.Response]], what: str, retry: bool = True, *,
        bound_s: float | None = None, peer: str = "the server",
    ) -> dict[str, Any]:  # fmt: skip
        """``checked_json(await send())``, retried; the whole call (retries included) within ``bound_s``."""
        started, tries = time.monotonic(), [0]
        if bound_s is None:
            return await self._acall(send, what, retry, tries)
        try:
            async with asyncio.timeout(bound_s):
                return await self._acall(send, what, retry, tries)
        except TimeoutError as exc:
            if isinstance(exc, WaitTimeout):
                raise
            raise self._timed_out(peer, what, started, bound_s, tries[0]) from exc

    async def _acall(self, send: Any, what: str, retry: bool, tries: list[int]) -> dict[str, Any]:
        attempts = self.retries + 1 if retry else 1
        for i in range(attempts):
            tries[0] = i + 1
            try:
                return checked_json(await send(), what)
            except (httpx.TransportError, ServerError) as exc:
                if not _retryable(exc) or i == attempts - 1:
                    raise self._give_up(exc, what, i + 1) from exc
            await asyncio.sleep(self.backoff_s * 2**i)
        raise AssertionError("unreachable")
