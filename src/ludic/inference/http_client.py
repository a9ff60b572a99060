"""One HTTP layer (httpx) for the blocking and async paths: retries with backoff, errors that keep their class.

Connection errors, timeouts and 5xx are retried with exponential backoff (``retries`` times);
a 4xx is the server refusing the request and raises ``RequestRefused`` (a ValueError) at once with
the server's status and message; a 5xx left after the retries raises ``ServerError`` with both.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx


class ServerError(RuntimeError):
    """The server failed (5xx) or could not be reached; the message says which and what it said."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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

    def call(self, send: Any, what: str, retry: bool = True) -> dict[str, Any]:
        attempts = self.retries + 1 if retry else 1
        for i in range(attempts):
            try:
                return checked_json(send(), what)
            except (httpx.TransportError, ServerError) as exc:
                if not _retryable(exc) or i == attempts - 1:
                    raise self._give_up(exc, what, i + 1) from exc
            time.sleep(self.backoff_s * 2**i)
        raise AssertionError("unreachable")

    async def acall(self, send: Any, what: str, retry: bool = True) -> dict[str, Any]:
        attempts = self.retries + 1 if retry else 1
        for i in range(attempts):
            try:
                return checked_json(await send(), what)
            except (httpx.TransportError, ServerError) as exc:
                if not _retryable(exc) or i == attempts - 1:
                    raise self._give_up(exc, what, i + 1) from exc
            await asyncio.sleep(self.backoff_s * 2**i)
        raise AssertionError("unreachable")
