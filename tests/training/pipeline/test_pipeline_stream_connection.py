"""PipelineStream's connection against a real Redis server: the URL's password and database, large replies,
error replies, lost and cancelled calls, Unix sockets, a server that does not speak RESP."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from ludic.training.pipeline.redis_server import RedisServer
from ludic.training.pipeline.stream import PipelineStream


async def test_it_authenticates_and_selects_the_urls_database(redis_server, run_id):
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    stream = PipelineStream(url, run_id)
    try:
        await stream.set_consumed(5)
        await stream.push_raw({"item": b"x"})
        assert await stream.counts() == {"pushed": 0, "consumed": 5, "length": 1}
    finally:
        await stream.close()
    in_3, in_0 = redis.Redis.from_url(url), redis.Redis.from_url(redis_server.url)
    assert in_3.get(stream.consumed_key) == b"5" and in_0.get(stream.consumed_key) is None
    in_3.close()
    in_0.close()


async def test_a_reply_many_times_the_read_size_arrives_whole(redis_server, run_id):
    value = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MB: several socket reads of 1 MiB
    stream = PipelineStream(redis_server.url, run_id)
    try:
        entry_id = (await stream.push_raw({"item": value})).decode()
        assert await stream.read("0-0", count=10, block_ms=None) == [(entry_id, {b"item": value})]
    finally:
        await stream.close()


async def test_a_reply_up_to_two_mib_crosses_without_pausing_the_socket(redis_server, run_id, monkeypatch):
    """redis-py's stream reader paused the socket at every 128 KiB buffered (two more epoll changes and loop
    turns each time: ~0.5 us of CPU per 512-token entry of a 64-entry XREAD); the stream's connection lets
    it buffer 2 MiB."""
    from asyncio import selector_events

    pauses = []
    pause = selector_events._SelectorSocketTransport.pause_reading
    monkeypatch.setattr(selector_events._SelectorSocketTransport, "pause_reading",
                        lambda self: pauses.append(1) or pause(self))  # fmt: skip
    value = bytes(range(256)) * (6 * 1024)  # 1.5 MiB
    stream = PipelineStream(redis_server.url, run_id)
    try:
        entry_id = (await stream.push_raw({"item": value})).decode()
        for _ in range(3):
            assert await stream.read("0-0", count=10, block_ms=None) == [(entry_id, {b"item": value})]
    finally:
        await stream.close()
    assert pauses == []


async def test_an_error_reply_is_raised_and_the_stream_goes_on(redis_server, run_id):
    stream = PipelineStream(redis_server.url, run_id)
    other = redis.Redis.from_url(redis_server.url)
    try:
        other.set(stream.items_key, "not a stream")
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await stream.read("0-0", count=10, block_ms=None)
        other.delete(stream.items_key)
        entry_id = (await stream.push_raw({"item": b"x"})).decode()
        assert await stream.read("0-0", count=10, block_ms=None) == [(entry_id, {b"item": b"x"})]
        assert stream.reconnects == 0
    finally:
        other.close()
        await stream.close()


async def test_a_wrong_password_is_refused_at_once_with_the_servers_reason(redis_server, run_id):
    url = redis_server.url.replace(f":{redis_server.password}@", ":not-the-password@")
    stream = PipelineStream(url, run_id, reconnect_timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(redis.AuthenticationError, match=r"WRONGPASS|invalid"):
        await stream.pending()
    assert time.monotonic() - t0 < 5 and stream.reconnects == 0  # not retried for reconnect_timeout_s
    await stream.close()


async def test_a_connection_killed_while_a_read_blocks_is_reopened_and_the_read_answers(redis_server, run_id):
    stream = PipelineStream(redis_server.url, run_id)
    killer = redis.Redis.from_url(redis_server.url)
    try:
        reading = asyncio.create_task(stream.read("0-0", count=10, block_ms=2000))
        await asyncio.sleep(0.1)  # the XREAD now waits in the server
        assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
        entry_id = killer.xadd(stream.items_key, {"item": b"late"}).decode()
        assert await asyncio.wait_for(reading, 10) == [(entry_id, {b"item": b"late"})]
        assert stream.reconnects == 1
    finally:
        killer.close()
        await stream.close()


async def test_a_cancelled_read_leaves_no_reply_to_answer_the_next_call(redis_server, run_id):
    stream = PipelineStream(redis_server.url, run_id)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await stream.read("0-0", count=10, block_ms=2000)
        await stream.set_version(3)
        entry_id = (await stream.push_raw({"item": b"x"})).decode()
        assert await stream.version() == 3
        assert await stream.read("0-0", count=10, block_ms=None) == [(entry_id, {b"item": b"x"})]
    finally:
        await stream.close()


async def test_a_server_that_does_not_speak_resp_fails_with_a_clear_error():
    """A server that answers garbage (a real socket on loopback, standing in for a broken Redis)."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"?not resp\r\n")
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stream = PipelineStream(f"redis://127.0.0.1:{port}/0", "garbage", reconnect_timeout_s=0.5)
    try:
        with pytest.raises(Exception, match=r"(?i)protocol|invalid|response"):
            await asyncio.wait_for(stream.pending(), 10)
    finally:
        await stream.close()
        server.close()
        await server.wait_closed()


class _UnixSocketRedis(RedisServer):
    def command(self) -> list[str]:
        return [*super().command(), "--unixsocket", str(self.data_dir / "redis.sock"), "--unixsocketperm", "700"]


async def test_unix_socket_urls_are_spoken_too(tmp_path):
    with _UnixSocketRedis(data_dir=tmp_path) as server:
        url = f"unix://:{server.password}@{tmp_path / 'redis.sock'}?db=2"
        stream = PipelineStream(url, "unix-run")
        try:
            await stream.set_consumed(5)
            assert await stream.pending() == -5
        finally:
            await stream.close()
        assert redis.Redis(host=server.host, port=server.port, password=server.password, db=2).get(
            "ludic:pipeline:unix-run:consumed"
        ) == b"5"


def test_a_read_left_pending_when_its_run_ends_is_cancelled_and_collected_without_errors(redis_server, run_id):
    """A stream dropped without ``close`` leaves its read pending when ``asyncio.run`` ends; the run cancels it,
    and neither that nor collecting the stream afterwards may raise (redis-py closes the connection).
"""
    import gc
    import sys

    raised: list[BaseException | None] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: raised.append(u.exc_value)

    async def leave_a_read_pending() -> None:
        stream = PipelineStream(redis_server.url, run_id)
        reading = asyncio.create_task(stream.read("0-0", count=10, block_ms=5000))  # noqa: F841, RUF006 - left pending
        await asyncio.sleep(0.05)  # the read is now waiting for its reply

    try:
        asyncio.run(leave_a_read_pending())
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert raised == []


def test_a_read_left_pending_when_its_event_loop_closed_is_collected_without_errors(redis_server, run_id):
    """The same with the loop closed by hand (nothing cancelled): when the coroutine is collected, closing the
    connection must not try to run anything on the dead loop."""
    import gc
    import sys

    raised: list[BaseException | None] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: raised.append(u.exc_value)
    loop = asyncio.new_event_loop()
    stream = PipelineStream(redis_server.url, run_id)
    try:
        task = loop.create_task(stream.read("0-0", count=10, block_ms=5000))
        loop.run_until_complete(asyncio.sleep(0.05))  # the read is now waiting for its reply
        loop.close()
        del task, stream
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert raised == []
