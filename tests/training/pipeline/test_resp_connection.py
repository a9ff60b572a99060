"""RespConnection against a real Redis server: handshake, replies larger than its buffer, errors, lost connections."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ludic.distributed.redis_server import RedisServer
from ludic.training.batching.pipeline_stream import PipelineStream
from ludic.training.batching.resp_connection import RespConnection, append_command, supports


def _resp(*args: bytes) -> bytes:
    parts: list[bytes] = []
    append_command(parts, *args)
    return b"".join(parts)


async def _call(conn: RespConnection, *args: bytes):
    await conn.send(_resp(*args))
    return await conn.read_response()


async def test_it_authenticates_selects_the_urls_database_and_reads_replies_in_order(redis_server):
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    conn = await RespConnection.open(url, timeout_s=5)
    try:
        await conn.send(_resp(b"SET", b"resp:k", b"v3") + _resp(b"INCR", b"resp:n") + _resp(b"GET", b"resp:k"))
        assert [await conn.read_response() for _ in range(3)] == [b"OK", 1, b"v3"]
    finally:
        await conn.aclose()
    client = redis.Redis.from_url(url)
    assert client.get("resp:k") == b"v3" and redis.Redis.from_url(redis_server.url).get("resp:k") is None
    client.close()


async def test_a_reply_many_times_its_read_buffer_arrives_whole(redis_server):
    value = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MB: several reads of the 1 MiB buffer
    conn = await RespConnection.open(redis_server.url, timeout_s=5)
    try:
        assert await _call(conn, b"SET", b"resp:big", value) == b"OK"
        assert await _call(conn, b"GET", b"resp:big") == value
    finally:
        await conn.aclose()


async def test_an_error_reply_is_raised_and_the_connection_goes_on(redis_server):
    conn = await RespConnection.open(redis_server.url, timeout_s=5)
    try:
        await _call(conn, b"SET", b"resp:str", b"x")
        with pytest.raises(Exception, match="WRONGTYPE"):
            await _call(conn, b"XLEN", b"resp:str")
        assert await _call(conn, b"GET", b"resp:str") == b"x"
    finally:
        await conn.aclose()


async def test_a_wrong_password_is_refused_with_the_servers_reason(redis_server):
    url = redis_server.url.replace(f":{redis_server.password}@", ":not-the-password@")
    with pytest.raises(Exception, match=r"WRONGPASS|invalid"):
        await RespConnection.open(url, timeout_s=5)


async def test_a_connection_killed_while_a_reply_is_awaited_fails_that_call_and_later_ones(redis_server):
    conn = await RespConnection.open(redis_server.url, timeout_s=5)
    await conn.send(_resp(b"CLIENT", b"SETNAME", b"resp-victim"))
    assert await conn.read_response() == b"OK"
    await conn.send(_resp(b"BLPOP", b"resp:never", b"10"))
    waiting = asyncio.create_task(conn.read_response())
    await asyncio.sleep(0.05)
    killer = redis.Redis.from_url(redis_server.url)
    victim = [c for c in killer.client_list() if c["name"] == "resp-victim"]
    killer.client_kill_filter(_id=victim[0]["id"])
    killer.close()
    with pytest.raises(ConnectionError, match="lost"):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(ConnectionError):
        await conn.send(_resp(b"PING"))


async def test_a_cancelled_wait_closes_the_connection_so_no_reply_answers_the_wrong_call(redis_server):
    conn = await RespConnection.open(redis_server.url, timeout_s=5)
    await conn.send(_resp(b"BLPOP", b"resp:never", b"10"))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await conn.read_response()
    with pytest.raises(ConnectionError):
        await _call(conn, b"PING")


async def test_bytes_that_are_not_resp_fail_the_connection_with_a_clear_error():
    """A server that answers garbage (a real socket on loopback, standing in for a broken Redis)."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"?not resp\r\n")
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await RespConnection.open(f"redis://127.0.0.1:{port}/0", timeout_s=5)
        with pytest.raises(ConnectionError, match="could not be parsed"):
            await asyncio.wait_for(_call(conn, b"PING"), 5)
        with pytest.raises(ConnectionError, match="could not be parsed"):
            await conn.send(_resp(b"PING"))
    finally:
        server.close()
        await server.wait_closed()


class _UnixSocketRedis(RedisServer):
    def command(self) -> list[str]:
        return [*super().command(), "--unixsocket", str(self.data_dir / "redis.sock"), "--unixsocketperm", "700"]


async def test_unix_socket_urls_are_spoken_too(tmp_path):
    with _UnixSocketRedis(data_dir=tmp_path) as server:
        url = f"unix://:{server.password}@{tmp_path / 'redis.sock'}?db=2"
        assert supports(url) and not supports("rediss://h:1")
        stream = PipelineStream(url, "unix-run")
        try:
            await stream.set_consumed(5)
            assert await stream._get_int(stream.consumed_key) == 5
        finally:
            await stream.close()
        assert redis.Redis(host=server.host, port=server.port, password=server.password, db=2).get(
            "ludic:pipeline:unix-run:consumed"
        ) == b"5"


def test_a_read_left_pending_when_its_event_loop_closed_is_collected_without_errors(redis_server):
    """A batch source dropped without ``aclose`` leaves its read-ahead pending; when the loop is gone and the
    coroutine is collected, closing the connection must not try to schedule anything on the dead loop."""
    import gc
    import sys

    raised: list[BaseException | None] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: raised.append(u.exc_value)
    loop = asyncio.new_event_loop()

    async def start() -> asyncio.Task:
        conn = await RespConnection.open(redis_server.url, timeout_s=5)

        async def reading():
            try:
                await conn.send(_resp(b"BLPOP", b"resp:nothing", b"5"))
                return await conn.read_response()
            except BaseException:
                await conn.aclose()  # as PipelineStream does on any failure
                raise

        return loop.create_task(reading())

    try:
        task = loop.run_until_complete(start())
        loop.run_until_complete(asyncio.sleep(0.05))  # the read is now waiting for its reply
        loop.close()
        del task
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert raised == []
