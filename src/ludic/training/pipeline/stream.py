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
``reconnect_timeout_s`` seconds (``[timeouts].redis_reconnect_s``), logging each retry, and then raises:
``ConnectionError`` when Redis refused or dropped the connection, ``ludic.timeouts.WaitTimeout`` (naming
Redis, the command and the time waited) when it accepted and did not answer (a stalled or stopped server).
A call so ends at most ``reconnect_timeout_s`` + one call's deadline after it started.

Redis is spoken through redis-py's asyncio client, hiredis parsing the replies. The two hot calls are one
write each, packed by redis-py and sent on one redis-py connection the stream keeps for them: ``push`` a
MULTI/EXEC transaction (the XADDs and the INCRBY), ``read_checked`` the consumed count's SET, the epoch's
SET NX and GET and the XREAD. They skip redis-py's ``Pipeline`` object, whose per-call work (a connection
taken from the pool and handed back through a task of its own, observability hooks, reply callbacks) cost
about 80 us of CPU per read, 40% of a 64-entry read of 512-token items, and a fifth more CPU per push
(``bench/bench_pipeline.py stream``); XREAD's reply is kept as Redis sends it (per entry
``[id, [name, value, ...]]``, no dict) and the codec decodes from those field lists. That connection's
socket reader buffers up to 2 MiB before pausing the socket (redis-py's default pauses at 128 KiB, a pause
and a resume per 128 KiB of a reply: ``_unthrottle``). The rest goes through the client's commands.

Timeouts: the connections have no socket timeout of their own (under one, redis-py writes through
``asyncio.wait_for``, a task of its own on Python 3.11, which would hold a read-ahead's XREAD back until
the caller next yields); each call runs under one deadline instead: ``call_timeout_s``
(``[timeouts].redis_s``; else the URL's ``socket_timeout``, else 30 s), plus XREAD's BLOCK. redis-py's own retries are off: ``_call`` retries, counts and logs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ludic.timeouts import WaitTimeout
from ludic.training.pipeline.redis_server import REDIS_EXTRA_HINT

log = logging.getLogger(__name__)
T = TypeVar("T")
_READ_SIZE = 1 << 20
"""Bytes redis-py asks of the socket per read (its default: 64 KiB; a 64-entry XREAD of 4,096-token items is
~2.4 MB)."""
_REPLY_TIMEOUT_S = 30.0
"""How long a call may take (beyond XREAD's BLOCK) where the URL sets no socket timeout."""


def _redis_asyncio() -> Any:
    try:
        import redis.asyncio as aioredis
    except ImportError as exc:
        raise ImportError(f"pipeline RL needs the redis client; {REDIS_EXTRA_HINT}") from exc
    return aioredis


def _unthrottle(conn: Any) -> None:
    """Let ``conn``'s socket reader hold up to 2 x ``_READ_SIZE`` before it pauses the socket.

    redis-py reads through an ``asyncio.StreamReader`` of the default limit (64 KiB), which stops reading the
    socket whenever more than 128 KiB wait in its buffer and starts again once redis-py takes them: two
    more epoll changes and event-loop turns per 128 KiB of an XREAD reply (307 kB for 64 entries of 512
    tokens, 2.4 MB at 4,096), about 0.5 us of CPU per 512-token entry. A reader without that attribute (another
    redis-py) is left as it is."""
    reader = getattr(conn, "_reader", None)
    if isinstance(reader, asyncio.StreamReader) and isinstance(getattr(reader, "_limit", None), int):
        reader._limit = max(reader._limit, _READ_SIZE)


class StreamResetError(RuntimeError):
    """Redis no longer holds the run the trainer was reading (restarted empty, or another server)."""


class PipelineStream:
    """Async access to one run's stream and counters over a real Redis connection."""

    def __init__(
        self, redis_url: str, run_id: str, *, reconnect_timeout_s: float = 60.0, call_timeout_s: float | None = None
    ) -> None:
        if not run_id or ":" in run_id:
            raise ValueError(f"run_id must be a non-empty string without ':', got {run_id!r}")
        if reconnect_timeout_s <= 0 or (call_timeout_s is not None and call_timeout_s <= 0):
            raise ValueError(f"reconnect_timeout_s ({reconnect_timeout_s}) and call_timeout_s ({call_timeout_s}) "
                             "must be > 0 seconds")  # fmt: skip
        self.redis_url = redis_url
        self.run_id = run_id
        self.reconnect_timeout_s = reconnect_timeout_s
        prefix = f"ludic:pipeline:{run_id}"
        self.items_key, self.pushed_key = f"{prefix}:items", f"{prefix}:pushed"
        self.consumed_key, self.version_key = f"{prefix}:consumed", f"{prefix}:version"
        self.epoch_key = f"{prefix}:epoch"
        self.reconnects = 0
        self._client: Any = None
        self._call_timeout_s = call_timeout_s  # None: the URL's socket_timeout, else _REPLY_TIMEOUT_S
        self._timeout_s = call_timeout_s or _REPLY_TIMEOUT_S
        self._conn: Any = (
            None  # the redis-py connection push and read go on (one at a time), opened on first use
        )
        self._conn_lock = asyncio.Lock()

    def _redis(self) -> Any:
        if self._client is None:
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            client = _redis_asyncio().Redis.from_url(
                self.redis_url,
                socket_connect_timeout=2.0,
                health_check_interval=0,
                socket_read_size=_READ_SIZE,
                retry=Retry(NoBackoff(), 0),
            )
            kwargs = client.connection_pool.connection_kwargs  # the URL's options included
            self._timeout_s = self._call_timeout_s or kwargs.get("socket_timeout") or _REPLY_TIMEOUT_S
            kwargs["socket_timeout"] = None  # see the module docstring: the deadline is _call's
            self._client = client
        return self._client

    async def _call(self, what: str, fn: Callable[[Any], Awaitable[T]], *, blocks_s: float = 0.0) -> T:
        """``fn(client)`` under one deadline, retried on a new connection while Redis is unreachable.

        ``blocks_s``: how long the server may hold the reply back (XREAD's BLOCK). A timed-out call is
        retried too (``TimeoutError`` is an ``OSError``)."""
        import redis

        started = time.monotonic()
        deadline = started + self.reconnect_timeout_s
        delay = 0.05
        while True:
            try:
                client = self._redis()
                async with asyncio.timeout(self._timeout_s + blocks_s):
                    return await fn(client)
            except redis.AuthenticationError:  # a wrong password stays wrong: say so now
                raise
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError) as exc:
                if time.monotonic() > deadline and isinstance(exc, TimeoutError | redis.TimeoutError):
                    raise WaitTimeout(
                        peer=f"Redis at {self._safe_url()}", operation=f"{what} (run {self.run_id!r})",
                        waited_s=time.monotonic() - started, bound_s=self.reconnect_timeout_s + self._timeout_s + blocks_s,
                        detail=f"each try waited {self._timeout_s + blocks_s:g} s for a reply; retried on new "
                        f"connections for {self.reconnect_timeout_s:g} s",
                    ) from exc  # fmt: skip
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

    async def _send(self, client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write on the stream's own connection and read their replies, in order, as
        Redis sent them (under ``_call``'s one deadline, not redis-py's timer per reply: a push reads 67). The write leaves before the first suspension (a read-ahead is on its way at once). Any failure
        (an error reply included) closes the connection: replies still unread would answer the next call."""
        async with self._conn_lock:
            pool = client.connection_pool
            conn = self._conn if self._conn is not None else await pool.get_connection()
            self._conn = conn
            try:
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                _unthrottle(conn)  # after the send, which connects a connection that is not
                return [await conn.read_response() for _ in commands]
            except BaseException:
                self._conn = None
                if asyncio._get_running_loop() is None:
                    # a read left pending when its event loop closed, now collected (a source never closed):
                    # nothing can be awaited; the socket closes with its transport. GeneratorExit ends the
                    # collection quietly (redis-py raised "no running event loop" on the way out)
                    raise GeneratorExit from None
                await conn.disconnect(nowait=True)
                await pool.release(conn)
                raise

    async def _drop_connection(self) -> None:
        self._conn = None  # closed with the client's pool
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # closing a dead connection may fail; the next call opens a new one
                log.debug("pipeline: closing a dead Redis connection failed", exc_info=True)

    # ---- writing (actors) ---------------------------------------------------------------------
    async def push(self, entries: Sequence[dict[str, bytes]]) -> list[bytes]:
        """XADD all ``entries`` and count them in one MULTI/EXEC: all land or none do."""
        import redis

        items_key = self.items_key
        commands: list[tuple[Any, ...]] = [("MULTI",)]
        commands += [
            ("XADD", items_key, "*", *[x for kv in fields.items() for x in kv]) for fields in entries
        ]
        commands += [("INCRBY", self.pushed_key, len(entries)), ("EXEC",)]
        try:
            replies = await self._call("XADD", lambda r: self._send(r, commands))
        except redis.ResponseError as exc:  # refused while queueing (EXECABORT): nothing ran
            raise RuntimeError(f"Redis refused the XADD transaction: {exc}") from exc
        results = replies[-1]  # EXEC: one reply per queued command
        failed = [r for r in results or [] if isinstance(r, Exception)]
        if results is None or failed:  # refused when run (e.g. WRONGTYPE)
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
        entry). ``consumed``: SET the consumed count first, in the same write."""
        return (await self.read_checked(after, count=count, block_ms=block_ms, consumed=consumed))[1]

    async def read_checked(
        self, after: str, *, count: int, block_ms: int | None, consumed: int | None = None,
        read_epoch: bool = False, set_epoch: bytes | None = None,
    ) -> tuple[bytes | None, list[Any]]:  # fmt: skip
        """``(epoch, entries)``: ``read_entries`` (the batch source's path) with the run's epoch read in the same
        write (``read_epoch``; else None), first set to ``set_epoch`` where Redis has none. The entries
        come from the Redis that epoch names: a changed or vanished epoch means Redis lost the run's keys."""
        block = () if block_ms is None else ("BLOCK", block_ms)

        commands: list[tuple[Any, ...]] = []
        if consumed is not None:
            commands.append(("SET", self.consumed_key, consumed))
        if set_epoch is not None:
            commands.append(("SET", self.epoch_key, set_epoch, "NX"))
        if read_epoch:
            commands.append(("GET", self.epoch_key))
        commands.append(("XREAD", "COUNT", count, *block, "STREAMS", self.items_key, after))

        replies = await self._call(
            "XREAD", lambda r: self._send(r, commands), blocks_s=(block_ms or 0) / 1000
        )
        epoch, reply = (replies[-2] if read_epoch else None), replies[-1]
        if not reply:  # nil: nothing arrived within block_ms
            return epoch, []
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
        value = await self._call("GET", lambda r: r.get(key))
        return int(value) if value is not None else 0

    async def pending(self) -> int:
        """Entries pushed but not yet consumed by the trainer."""
        pushed, consumed = await self._call("MGET", lambda r: r.mget(self.pushed_key, self.consumed_key))
        return int(pushed or 0) - int(consumed or 0)

    async def set_consumed(self, n: int) -> None:
        """SET the consumed count (the batch source sends it with its reads where it can: ``read_checked``)."""
        await self._call("SET", lambda r: r.set(self.consumed_key, int(n)))

    async def counts(self) -> dict[str, int]:
        """What Redis holds for the run now: ``pushed``, ``consumed`` and the stream's ``length``."""

        def pipeline(r: Any) -> Awaitable[list[Any]]:
            return (
                r.pipeline(transaction=True)
                .get(self.pushed_key)
                .get(self.consumed_key)
                .xlen(self.items_key)
                .execute()
            )

        pushed, consumed, length = await self._call("GET", pipeline)
        return {"pushed": int(pushed or 0), "consumed": int(consumed or 0), "length": int(length)}

    async def version(self) -> int:
        return await self._get_int(self.version_key)

    async def set_version(self, version: int) -> None:
        await self._call("SET", lambda r: r.set(self.version_key, int(version)))

    async def close(self) -> None:
        await self._drop_connection()
