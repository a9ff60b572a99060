"""One Redis stream per pipeline run, and the few keys actors and trainer share beside it.

Keys (``run_id`` names the run)::

    ludic:pipeline:{run_id}:items     STREAM  one entry per SAW item (XADD by actors, XREAD by the trainer)
    ludic:pipeline:{run_id}:pushed    INT     entries actors have added (INCRBY in the XADD transaction)
    ludic:pipeline:{run_id}:consumed  INT     entries the trainer has consumed (set after each batch)
    ludic:pipeline:{run_id}:version   INT     the policy version the trainer last published
    ludic:pipeline:{run_id}:epoch     STR     a random token the trainer's first read sets (SET NX); every
                                              read GETs it: another one, or none, means Redis lost the run's
                                              keys (``StreamResetError``)

Every call retries through a lost connection (a Redis restart, a network blip) for up to
``reconnect_timeout_s`` seconds, logging each retry, and then raises.

The two hot calls, ``push`` (a MULTI/EXEC of XADDs) and ``read`` (XREAD), skip redis-py's per-command
layer: the commands are written as one RESP buffer on a connection of their own (``RespConnection``:
replies parsed as the bytes arrive) and the raw replies are read back (redis-py's argument packing, reply
callbacks and stream reader cost more per entry than Redis's own work; ``bench/bench_pipeline.py
stream``). The rest goes through the ordinary redis-py client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ludic.distributed.redis_server import REDIS_EXTRA_HINT
from ludic.training.batching.resp_connection import (
    RawConnection,
    RedisPyConnection,
    RespConnection,
    append_command,
    supports,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_READ_SIZE = 1 << 20
"""Bytes redis-py asks of the socket per read (its default: 64 KiB) on the ordinary client and on the raw
connection of a ``rediss://`` URL (a 64-entry XREAD of 4,096-token items is ~2.4 MB)."""
_REPLY_TIMEOUT_S = 30.0
"""How long a write, or a reply, may take where the URL sets no socket timeout (redis-py 8 sets 5 s)."""


def _redis_asyncio() -> Any:
    try:
        import redis.asyncio as aioredis
    except ImportError as exc:
        raise ImportError(f"pipeline RL needs the redis client; {REDIS_EXTRA_HINT}") from exc
    return aioredis


class StreamResetError(RuntimeError):
    """Redis no longer holds the run the trainer was reading (restarted empty, or another server)."""


class PipelineStream:
    """Async access to one run's stream and counters over a real Redis connection."""

    def __init__(self, redis_url: str, run_id: str, *, reconnect_timeout_s: float = 60.0) -> None:
        if not run_id or ":" in run_id:
            raise ValueError(f"run_id must be a non-empty string without ':', got {run_id!r}")
        self.redis_url = redis_url
        self.run_id = run_id
        self.reconnect_timeout_s = reconnect_timeout_s
        prefix = f"ludic:pipeline:{run_id}"
        self.items_key, self.pushed_key = f"{prefix}:items", f"{prefix}:pushed"
        self.consumed_key, self.version_key = f"{prefix}:consumed", f"{prefix}:version"
        self.epoch_key = f"{prefix}:epoch"
        self.reconnects = 0
        self._client: Any = None
        self._raw: RawConnection | None = None  # the connection push/read/counters use, opened on first use
        self._unread = 0  # replies to commands sent with wait=False, read by the next exchange
        self._unconfirmed: list[tuple[bytes, int]] = []  # those commands, sent again on a new connection
        self._raw_lock = asyncio.Lock()
        self._raw_timeout_s = _REPLY_TIMEOUT_S

    def _redis(self) -> Any:
        if self._client is None:
            self._client = _redis_asyncio().Redis.from_url(
                self.redis_url,
                socket_connect_timeout=2.0,
                health_check_interval=0,
                socket_read_size=_READ_SIZE,
            )
        return self._client

    async def _call(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        import redis

        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.05
        while True:
            try:
                return await fn(self._redis())
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"Redis at {self._safe_url()} unreachable for {self.reconnect_timeout_s} s "
                        f"during {what}: {exc}"
                    ) from exc
                self.reconnects += 1
                log.warning("pipeline: Redis %s failed (%s); reconnecting in %.2f s", what, exc, delay)
                await self._drop_connection()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _safe_url(self) -> str:
        return self.redis_url.split("@")[-1]

    async def _exchange(
        self, payload: bytes, n_replies: int, *, wait: bool = True, blocks_s: float = 0.0
    ) -> list[Any]:
        """Send RESP-encoded commands on the raw connection and read ``n_replies`` replies back.

        ``wait=False`` (idempotent commands only) returns once the commands are written; their replies are
        read by the next exchange, which comes after them on the same connection, so Redis has run them
        by then. Until then they count as unconfirmed and are sent again first on a new connection (the
        server may have died before running them). ``blocks_s``: how long the server may hold the reply back
        (XREAD's BLOCK), beyond the connection's socket timeout. Any failure (an error reply mid-way included) closes
        the connection: the replies still unread would otherwise answer the next call, and an unfinished
        MULTI is discarded by the server.
        """
        async with self._raw_lock:
            if self._raw is None:
                await self._open_raw()
            conn = self._raw
            try:
                await conn.send(payload)  # written before this returns: a read-ahead is on its way at once
                if not wait:
                    self._unconfirmed.append((payload, n_replies))
                    self._unread += n_replies
                    return []
                # one deadline for all replies (a push reads 67 of them); TimeoutError is an OSError: _call
                # reconnects
                async with asyncio.timeout(self._raw_timeout_s + blocks_s):
                    while self._unread:
                        await conn.read_response()  # an error reply raises: dropped below
                        self._unread -= 1
                    self._unconfirmed.clear()
                    return [await conn.read_response() for _ in range(n_replies)]
            except BaseException:
                self._raw = None
                await conn.aclose()
                raise

    async def _open_raw(self) -> None:
        """Open the raw connection (``RespConnection``; redis-py's for ``rediss://``) and send again what an
        earlier connection may have lost."""
        pool = self._redis().connection_pool
        self._raw_timeout_s = pool.connection_kwargs.get("socket_timeout") or _REPLY_TIMEOUT_S
        if supports(self.redis_url):
            conn = await RespConnection.open(self.redis_url, timeout_s=self._raw_timeout_s)
        else:
            conn = await RedisPyConnection.open(pool, timeout_s=self._raw_timeout_s)
        self._raw, self._unread = conn, 0
        try:
            for sent, replies in self._unconfirmed:
                await conn.send(sent)
                self._unread += replies
        except BaseException:
            self._raw = None
            await conn.aclose()
            raise

    async def _drop_connection(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            await raw.aclose()
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # closing a dead connection may fail; the next call opens a new one
                log.debug("pipeline: closing a dead Redis connection failed", exc_info=True)

    # ---- writing (actors) ---------------------------------------------------------------------
    async def push(self, entries: Sequence[dict[str, bytes]]) -> list[bytes]:
        """XADD all ``entries`` and count them in one MULTI/EXEC: all land or none do."""
        key = self.items_key.encode()
        xadd = b"$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n" % (len(key), key)
        parts: list[bytes] = []
        append_command(parts, b"MULTI")
        for fields in entries:  # XADD key * name value ...: append_command written out, the fixed part once
            parts += (b"*%d\r\n" % (3 + 2 * len(fields)), xadd)
            for name, value in fields.items():
                name_b = name.encode() if isinstance(name, str) else name
                parts += (b"$%d\r\n%s\r\n$%d\r\n" % (len(name_b), name_b, len(value)), value, b"\r\n")
        append_command(parts, b"INCRBY", self.pushed_key.encode(), b"%d" % len(entries))
        append_command(parts, b"EXEC")
        payload = b"".join(parts)
        replies = await self._call("XADD", lambda _: self._exchange(payload, len(entries) + 3))
        results = replies[-1]  # EXEC: one reply per queued command
        failed = [r for r in results or [] if isinstance(r, Exception)]
        if results is None or failed:
            raise RuntimeError(f"Redis refused the XADD transaction: {failed[0] if failed else 'aborted'}")
        return list(results[:-1])

    async def push_raw(self, fields: dict[str, bytes]) -> bytes:
        """XADD one entry as given (tests and tools; actors use ``push``)."""
        return await self._call("XADD", lambda r: r.xadd(self.items_key, fields))

    # ---- reading (the trainer's rank 0) -------------------------------------------------------
    async def read(
        self, after: str, *, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[bytes, bytes]]]:
        """Up to ``count`` entries with ids after ``after``, waiting up to ``block_ms`` for the first (None: what
        is there now)."""
        entries = await self.read_entries(after, count=count, block_ms=block_ms)
        return [(eid.decode(), dict(zip(flat[0::2], flat[1::2], strict=False))) for eid, flat in entries]

    async def read_entries(
        self, after: str, *, count: int, block_ms: int | None, consumed: int | None = None
    ) -> list[Any]:
        """``read``'s entries as Redis sends them, ``[id, [name, value, ...]]`` in bytes (no dict built per
        entry). ``consumed``: SET the consumed count first, in the same write (one system call, not two)."""
        return (await self.read_checked(after, count=count, block_ms=block_ms, consumed=consumed))[1]

    async def read_checked(
        self, after: str, *, count: int, block_ms: int | None, consumed: int | None = None,
        read_epoch: bool = False, set_epoch: bytes | None = None,
    ) -> tuple[bytes | None, list[Any]]:  # fmt: skip
        """``(epoch, entries)``: ``read_entries`` (the batch source's path) with the run's epoch read in the same
        exchange (``read_epoch``; else None), first set to ``set_epoch`` where Redis has none. The entries
        come from the Redis that epoch names: a changed or vanished epoch means Redis lost the run's keys."""
        parts: list[bytes] = []
        if consumed is not None:
            append_command(parts, b"SET", self.consumed_key.encode(), b"%d" % consumed)
        if set_epoch is not None:
            append_command(parts, b"SET", self.epoch_key.encode(), set_epoch, b"NX")
        if read_epoch:
            append_command(parts, b"GET", self.epoch_key.encode())
        block = () if block_ms is None else (b"BLOCK", b"%d" % block_ms)
        key = self.items_key.encode()
        append_command(parts, b"XREAD", b"COUNT", b"%d" % count, *block, b"STREAMS", key, after.encode())
        payload = b"".join(parts)
        blocks_s = (block_ms or 0) / 1000
        n_replies = 1 + (consumed is not None) + (set_epoch is not None) + read_epoch
        replies = await self._call("XREAD", lambda _: self._exchange(payload, n_replies, blocks_s=blocks_s))
        epoch, reply = (replies[-2] if read_epoch else None), replies[-1]
        if not reply:  # nil: nothing arrived within block_ms
            return epoch, []
        # [[key, entries]] in RESP2; some parser versions give {key: entries}
        return epoch, next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]

    async def trim_before(self, entry_id: str) -> int:
        """XTRIM MINID: drop entries older than ``entry_id`` (call only once a checkpoint covers them)."""
        return int(
            await self._call("XTRIM", lambda r: r.xtrim(self.items_key, minid=entry_id, approximate=False))
        )

    # ---- shared counters ----------------------------------------------------------------------
    async def length(self) -> int:
        return int(await self._call("XLEN", lambda r: r.xlen(self.items_key)))

    async def _get_int(self, key: str) -> int:
        (value,) = await self._raw_call("GET", b"GET", key.encode())
        return int(value) if value is not None else 0

    async def pending(self) -> int:
        """Entries pushed but not yet consumed by the trainer."""
        return await self._get_int(self.pushed_key) - await self._get_int(self.consumed_key)

    async def set_consumed(self, n: int, *, wait: bool = True) -> None:
        """SET the consumed count. ``wait=False`` (the trainer, after each batch) does not wait for the reply:
        the count only steers actors' admission, and a SET lost with a dropped connection is made good by
        the next one; this stream's own reads (``pending``) still come after it."""
        await self._raw_call("SET", b"SET", self.consumed_key.encode(), b"%d" % int(n), wait=wait)

    async def _raw_call(self, what: str, *args: bytes, wait: bool = True) -> list[Any]:
        parts: list[bytes] = []
        append_command(parts, *args)
        payload = b"".join(parts)
        return await self._call(what, lambda _: self._exchange(payload, 1, wait=wait))

    async def counts(self) -> dict[str, int]:
        """What Redis holds for the run now: ``pushed``, ``consumed`` and the stream's ``length``."""
        return {
            "pushed": await self._get_int(self.pushed_key),
            "consumed": await self._get_int(self.consumed_key),
            "length": await self.length(),
        }

    async def version(self) -> int:
        return await self._get_int(self.version_key)

    async def set_version(self, version: int) -> None:
        await self._call("SET", lambda r: r.set(self.version_key, int(version)))

    async def close(self) -> None:
        await self._drop_connection()
