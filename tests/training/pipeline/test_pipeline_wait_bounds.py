"""No wait of the pipeline is endless: a stalled Redis, a trainer no actor feeds, an actor the trainer never
admits or makes room for each fail within their bound with ``WaitTimeout`` naming the peer, the operation
and what was seen. Before these bounds the trainer and the actor polled forever, and a stalled Redis held each
call for 30 s per try."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from ludic.timeouts import WaitTimeout
from ludic.training.pipeline import PipelineBatchSource, run_pipeline_actor
from ludic.training.pipeline.codec import encode_item
from ludic.training.pipeline.redis_server import RedisServer
from ludic.training.pipeline.stream import PipelineStream
from ludic.training.types import SAWBatch

pytestmark = pytest.mark.timeout(60)  # the old code hangs in each of these


@pytest.fixture
def stalled_redis():
    """A private Redis, SIGSTOPped once the test asks for it (``stop()``), SIGCONTed and closed afterwards."""
    server = RedisServer().start()
    pid = server.process.pid

    def stop() -> None:
        os.kill(pid, signal.SIGSTOP)

    try:
        yield server, stop
    finally:
        os.kill(pid, signal.SIGCONT)
        server.close()  # stops it and removes its data directory


async def test_a_call_to_a_stalled_redis_fails_within_its_bound_naming_redis_and_the_command(stalled_redis, run_id):
    server, stop = stalled_redis
    stream = PipelineStream(server.url, run_id, call_timeout_s=0.5, reconnect_timeout_s=1.0)
    try:
        assert await stream.length() == 0  # answered while running
        stop()
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as info:
            await stream.length()
        waited = time.monotonic() - started
    finally:
        await stream.close()
    err = info.value
    assert 1.0 <= waited <= 1.5 + 0.1 + 0.6, waited  # retries for 1 s, the last try up to 0.5 s more
    assert err.peer == f"Redis at {server.host}:{server.port}/0"
    assert err.operation == f"XLEN (run {run_id!r})"
    assert err.bound_s == 1.5 and 1.0 <= err.waited_s <= waited
    assert "each try waited 0.5 s" in str(err) and server.password not in str(err)
    assert stream.reconnects >= 1


async def test_a_trainer_no_actor_feeds_stops_waiting_naming_the_stream_and_counts(redis_server, run_id, make_item):
    source = PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=4, vocab_size=64,
                                 block_ms=100, queue_wait_s=1.0, max_staleness=5)  # fmt: skip
    writer = PipelineStream(redis_server.url, run_id)
    try:
        await writer.push([encode_item(make_item(n), run_id=run_id, item_id=f"i{n}") for n in range(2)])
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as info:
            await source.next_batch()
        waited = time.monotonic() - started
        err = info.value
        assert 1.0 <= waited <= 1.0 + 0.1 + 0.8, waited
        assert err.peer == f"the actors (Redis stream 'ludic:pipeline:{run_id}:items' at 127.0.0.1:{redis_server.port}/0)"
        assert err.operation == "the trainer waiting for its next batch" and err.bound_s == 1.0
        assert "2 of 4 items so far" in err.detail
        assert "pushed=2, consumed=2, pending=0, stream length=2" in err.detail
        # the two items gathered are not lost: the next call completes the batch with them
        await writer.push([encode_item(make_item(n), run_id=run_id, item_id=f"i{n}") for n in range(2, 4)])
        batch = await source.next_batch()
        assert [it.meta["n"] for it in batch.items] == [0, 1, 2, 3]
    finally:
        await source.close()
        await writer.close()


class FixedBatches:
    """A batch source of ``size`` items per batch, numbered on (what an actor generates, without a model)."""

    def __init__(self, make_item, size: int) -> None:
        self.make_item, self.size, self.n = make_item, size, 0

    async def next_batch(self) -> SAWBatch:
        items = [self.make_item(self.n + i) for i in range(self.size)]
        self.n += self.size
        return SAWBatch(items=items, meta={})


async def test_an_actor_never_admitted_stops_waiting_naming_the_trainer_and_the_counts(redis_server, run_id, make_item):
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:  # budget (0 + 1) x 2: the first batch fills it, nobody reads it
        await run_pipeline_actor(source=FixedBatches(make_item, 2), redis_url=redis_server.url, run_id=run_id,
                                 trainer_batch_size=2, max_staleness=0, wait_s=1.0, poll_s=0.05)  # fmt: skip
    waited = time.monotonic() - started
    err = info.value
    assert 1.0 <= waited <= 1.0 + 1.0, waited
    assert err.peer == f"the trainer (Redis stream 'ludic:pipeline:{run_id}:items' at 127.0.0.1:{redis_server.port}/0)"
    assert err.operation == "the actor waiting for admission" and err.bound_s == 1.0 and err.waited_s >= 1.0
    assert "pending + last batch (2) <= 2" in err.detail and "last seen: pending=2" in err.detail
    counts_stream = PipelineStream(redis_server.url, run_id)
    assert (await counts_stream.counts())["pushed"] == 2  # the first batch went in whole
    await counts_stream.close()


async def test_an_actor_without_room_in_the_stream_stops_waiting(redis_server, run_id, make_item):
    with pytest.raises(WaitTimeout) as info:  # 3 entries at most: the second batch of 2 never fits
        await run_pipeline_actor(source=FixedBatches(make_item, 2), redis_url=redis_server.url, run_id=run_id,
                                 trainer_batch_size=100, max_stream_len=3, wait_s=0.5, poll_s=0.05)  # fmt: skip
    err = info.value
    assert err.operation == "the actor waiting for room in the stream" and 0.5 <= err.waited_s <= 1.2
    assert "length + 2 <= 3" in err.detail and "stream_length=2" in err.detail


async def test_a_stopped_actor_still_returns_without_error(redis_server, run_id, make_item):
    stop = asyncio.Event()
    task = asyncio.create_task(run_pipeline_actor(
        source=FixedBatches(make_item, 2), redis_url=redis_server.url, run_id=run_id, trainer_batch_size=2,
        max_staleness=0, wait_s=30.0, poll_s=0.05, stop=stop))  # fmt: skip
    await asyncio.sleep(0.5)
    stop.set()
    stats = await asyncio.wait_for(task, 5)
    assert stats.batches == 1 and stats.admission_wait_seconds > 0


@pytest.mark.parametrize("bad", [{"queue_wait_s": 0}, {"call_timeout_s": -1.0}, {"reconnect_timeout_s": 0}])
def test_a_bound_of_zero_or_less_is_refused(redis_server, run_id, bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=1, vocab_size=8, **bad)


def test_announcing_a_version_to_a_stalled_redis_fails_within_its_bound(stalled_redis, run_id) -> None:
    from ludic.training.pipeline import PipelineVersionPublisher

    server, stop = stalled_redis
    publisher = PipelineVersionPublisher(None, redis_url=server.url, run_id=run_id, call_timeout_s=0.5,
                                         reconnect_timeout_s=1.0)  # fmt: skip
    publisher.publish({}, version=1)  # answered while running
    stop()
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as info:  # before: the SET waited with no socket timeout, for ever
        publisher.publish({}, version=2)
    waited = time.monotonic() - started
    assert 1.0 <= waited <= 1.5 + 0.6, waited
    assert info.value.peer == f"Redis at {server.host}:{server.port}/0"
    assert info.value.operation == f"SET ludic:pipeline:{run_id}:version (announcing version 2)"
