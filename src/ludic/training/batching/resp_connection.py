"""A lean RESP connection for the pipeline stream's hot path: replies parsed as the bytes arrive.

redis-py's asyncio connection reads through a ``StreamReader`` that pauses the socket at 128 KiB buffered
and hands over at most 256 KiB per event-loop turn, copying each chunk twice before its parser sees it.
An XREAD of 64 items of 4,096 tokens is a 2.4 MB reply, so the trainer spent about a millisecond per
batch in those turns after the reply had already arrived. Here the transport reads up to 1 MiB at a time
straight into one preallocated buffer (``asyncio.BufferedProtocol``), hiredis parses each read as it
comes, and each parsed reply resolves the oldest waiting future. With the read-ahead's XREAD also written
at once (``send`` never yields), the trainer pops 1.32x / 1.25x as many items per second at 4,096 / 512
tokens as through redis-py's connection (``bench/bench_pipeline.py stream --against``).

Plain TCP (``redis://``) and Unix sockets (``unix://``); the handshake is AUTH (user and password from the
URL) and SELECT when the URL names a database other than 0. ``rediss://`` (TLS, with redis-py's many
certificate options) stays on redis-py's own connection through ``RedisPyConnection``; no test here runs a
TLS server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import socket
from typing import Any, Protocol

from ludic.distributed.redis_server import REDIS_EXTRA_HINT

_BUFFER_BYTES = 1 << 20
"""What the transport may write per read (asyncio's own transports read at most 256 KiB)."""


class RawConnection(Protocol):
    """What the pipeline stream needs of a connection: write RESP, read replies in order, close."""

    async def send(self, payload: bytes) -> None: ...

    async def read_response(self) -> Any: ...

    async def aclose(self) -> None: ...


def append_command(parts: list[bytes], *args: bytes) -> None:
    """Append one command in RESP (an array of bulk strings) to ``parts``."""
    parts.append(b"*%d\r\n" % len(args))
    for arg in args:
        parts += (b"$%d\r\n" % len(arg), arg, b"\r\n")


def supports(redis_url: str) -> bool:
    """Whether ``RespConnection`` can open ``redis_url`` (else use redis-py's connection)."""
    return redis_url.startswith(("redis://", "unix://"))


class _RespProtocol(asyncio.BufferedProtocol):
    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self._buffer = bytearray(_BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.failure: BaseException | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self._reader.feed(self._view, 0, nbytes)
        while self.waiting:
            try:
                reply = self.next_parsed()
            except ConnectionError:  # every waiter has been failed
                return
            if reply is False:
                return
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(reply)

    def next_parsed(self) -> Any:
        """The next reply already received in full, or False; bytes that are not RESP fail the connection."""
        try:
            return self._reader.gets()
        except Exception as exc:  # a protocol error: the stream is unusable from here on
            failure = ConnectionError(f"Redis sent a reply that could not be parsed: {exc}")
            self._fail(failure)
            raise failure from exc

    def close(self) -> None:
        self._fail(ConnectionError("connection to Redis closed by this process"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection to Redis lost: {exc or 'closed by the server'}"))

    def _fail(self, exc: BaseException) -> None:
        """Fail every waiting and later call with ``exc`` (the first failure is the one reported)."""
        if self.failure is None:
            self.failure = exc
        exc = self.failure
        if self.transport is not None and self._loop.is_closed():
            # a read left pending when its event loop closed, now collected: nothing can be scheduled any
            # more, so end the connection at the socket (its descriptor closes with the transport)
            self.waiting.clear()
            with contextlib.suppress(OSError):
                self.transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
            self.transport = None
            return
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


class RespConnection:
    """One connection: ``send`` writes commands already in RESP, ``read_response`` awaits the next reply.

    Error replies come back as exceptions from ``read_response`` (hiredis makes them ``ReplyError``
    instances; they are raised here). A lost connection fails every waiting and later call with
    ``ConnectionError`` (an ``OSError``)."""

    def __init__(self, protocol: _RespProtocol) -> None:
        self._protocol = protocol

    @classmethod
    async def open(cls, redis_url: str, *, timeout_s: float) -> RespConnection:
        try:
            import hiredis
            from redis.asyncio.connection import parse_url
        except ImportError as exc:
            raise ImportError(f"pipeline RL's Redis connection needs redis and hiredis; {REDIS_EXTRA_HINT}") from exc

        options = parse_url(redis_url)
        loop = asyncio.get_running_loop()
        protocol = _RespProtocol(hiredis.Reader())
        async with asyncio.timeout(timeout_s):
            if "path" in options:
                await loop.create_unix_connection(lambda: protocol, options["path"])
            else:
                await loop.create_connection(lambda: protocol, options.get("host", "localhost"), options.get("port", 6379))
            conn = cls(protocol)
            try:
                await conn._handshake(options)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _handshake(self, options: dict[str, Any]) -> None:
        commands: list[tuple[bytes, ...]] = []
        if options.get("password") is not None:
            user = options.get("username")
            commands.append((b"AUTH", *([user.encode()] if user else []), options["password"].encode()))
        if int(options.get("db") or 0):
            commands.append((b"SELECT", str(int(options["db"])).encode()))
        if not commands:
            return
        parts: list[bytes] = []
        for command in commands:
            append_command(parts, *command)
        await self.send(b"".join(parts))
        for _ in commands:
            await self.read_response()

    async def send(self, payload: bytes) -> None:
        """Write ``payload`` before returning, without yielding (the transport buffers what the socket does not
        take at once)."""
        protocol = self._protocol
        if protocol.failure is not None:
            raise protocol.failure
        assert protocol.transport is not None
        protocol.transport.write(payload)

    async def read_response(self) -> Any:
        """The next reply, in order; an error reply is raised."""
        protocol = self._protocol
        if protocol.failure is not None:
            raise protocol.failure
        reply = protocol.next_parsed() if not protocol.waiting else False  # received before this call
        if reply is False:
            future = asyncio.get_running_loop().create_future()
            protocol.waiting.append(future)
            try:
                reply = await future
            except asyncio.CancelledError:  # its reply would answer the next call: the connection is done
                self.close()
                raise
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self._protocol.close()

    async def aclose(self) -> None:
        self.close()


class RedisPyConnection:
    """The same three calls over redis-py's own connection (``rediss://``: TLS and its options)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, pool: Any, *, timeout_s: float) -> RedisPyConnection:
        # no socket timeout of redis-py's: under one it writes through a task of its own (asyncio.wait_for on
        # Python 3.11), which would hold a read-ahead's XREAD back until the caller next yields
        conn = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        async with asyncio.timeout(timeout_s):
            await conn.connect()
        return cls(conn)

    async def send(self, payload: bytes) -> None:
        await self._conn.send_packed_command(payload, check_health=False)

    async def read_response(self) -> Any:
        return await self._conn.read_response(timeout=math.inf)

    async def aclose(self) -> None:
        await self._conn.disconnect(nowait=True)
