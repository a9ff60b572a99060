"""PipelineBatchSource over a real Redis server: order, bad entries, staleness, cursor, trimming."""

from __future__ import annotations

import logging

import pytest

from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.codec import encode_item
from ludic.training.pipeline.stream import PipelineStream


async def _push(url: str, run_id: str, items, *, ids=None) -> list[str]:
    stream = PipelineStream(url, run_id)
    try:
        entries = [encode_item(it, run_id=run_id, item_id=ids[i] if ids else f"item-{it.meta['n']}")
                   for i, it in enumerate(items)]  # fmt: skip
        return [i.decode() for i in await stream.push(entries)]
    finally:
        await stream.close()


def _source(server, run_id, **kw) -> PipelineBatchSource:
    kw.setdefault("version_fn", lambda: 0)
    kw.setdefault("vocab_size", 1000)
    return PipelineBatchSource(redis_url=server.url, run_id=run_id, block_ms=50, **kw)


async def test_batches_come_in_stream_order_and_count_consumed(redis_server, run_id, make_item):
    await _push(redis_server.url, run_id, [make_item(n) for n in range(6)])
    source = _source(redis_server, run_id, batch_size=4)
    first, second_src = await source.next_batch(), None
    assert [it.meta["n"] for it in first.items] == [0, 1, 2, 3]
    assert first.items[0].attachments.actor_logps.token_logps == [-0.5, -0.25]
    assert await source.stream.pending() == 2
    await _push(redis_server.url, run_id, [make_item(n) for n in range(6, 8)])
    second_src = await source.next_batch()
    assert [it.meta["n"] for it in second_src.items] == [4, 5, 6, 7]
    assert await source.stream.pending() == 0
    await source.close()


async def test_bad_entries_are_skipped_counted_and_logged(redis_server, run_id, make_item, caplog):
    url = redis_server.url
    await _push(url, run_id, [make_item(0)])
    stream = PipelineStream(url, run_id)
    good = encode_item(make_item(1), run_id=run_id, item_id="item-1")
    await stream.push_raw(dict(good))
    await stream.push_raw(dict(good))  # duplicate (a retried XADD)
    await stream.push_raw({"item": good["item"][:40]})  # truncated
    await stream.push_raw(encode_item(make_item(2), run_id="other-run", item_id="z"))  # foreign
    await stream.push_raw({"v": b"2", "run": run_id.encode(), "data": good["item"]})  # unknown schema (2)
    await stream.push_raw({"hello": b"world"})  # malformed
    await stream.close()
    await _push(url, run_id, [make_item(3)])
    source = _source(redis_server, run_id, batch_size=3)
    with caplog.at_level(logging.WARNING, logger="ludic.training.pipeline.batch_source"):
        batch = await source.next_batch()
    assert [it.meta["n"] for it in batch.items] == [0, 1, 3]
    for reason in ("duplicate", "truncated", "foreign", "unknown_schema", "malformed"):
        assert source.counters[f"pipeline/skipped_{reason}"] == 1, reason
        assert batch.meta[f"pipeline/skipped_{reason}"] == 1.0
        assert any(reason in r.getMessage() for r in caplog.records), reason
    assert source.consumed == 8
    await source.close()


async def test_items_more_than_max_staleness_behind_are_dropped(redis_server, run_id, make_item):
    versions = [0, 1, 2, 3, 3, 1]
    await _push(redis_server.url, run_id, [make_item(n, version=v) for n, v in enumerate(versions)])
    source = _source(redis_server, run_id, batch_size=3, max_staleness=1, version_fn=lambda: 3)
    batch = await source.next_batch()
    assert [it.meta["policy_version"] for it in batch.items] == [2, 3, 3]
    assert batch.meta["pipeline/dropped_stale"] == 2.0  # versions 0 and 1; the late 1 is not read yet
    assert batch.meta["pipeline/trainer_version"] == 3.0
    assert batch.meta["pipeline/mean_staleness"] == pytest.approx(1 / 3)
    await source.close()


async def test_max_staleness_zero_keeps_only_current_policy_and_reads_published_version(
    redis_server, run_id, make_item
):
    await _push(redis_server.url, run_id, [make_item(n, version=v) for n, v in enumerate([4, 5, 5])])
    source = PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=2, vocab_size=1000, max_staleness=0)
    await source.stream.set_version(5)  # what PipelineVersionPublisher announces
    batch = await source.next_batch()
    assert [it.meta["n"] for it in batch.items] == [1, 2]
    assert source.counters["pipeline/dropped_stale"] == 1
    await source.close()


async def test_state_dict_resumes_after_the_cursor_without_repeat_or_skip(redis_server, run_id, make_item):
    await _push(redis_server.url, run_id, [make_item(n) for n in range(5)])
    first = _source(redis_server, run_id, batch_size=2)
    await first.next_batch()
    state = first.state_dict()
    await first.next_batch()  # trained after the checkpoint, then the trainer "crashed"
    await first.close()
    resumed = _source(redis_server, run_id, batch_size=3)
    resumed.load_state_dict(state)
    batch = await resumed.next_batch()
    assert [it.meta["n"] for it in batch.items] == [2, 3, 4]
    assert resumed.consumed == 5
    await resumed.close()


async def test_entries_read_ahead_are_not_consumed_until_returned(redis_server, run_id, make_item):
    """The read after a batch is sent before the batch is decoded; what it fetched is neither counted nor
    checkpointed until a later next_batch returns it, and a resumed source reads it again."""
    await _push(redis_server.url, run_id, [make_item(n) for n in range(4)])
    source = _source(redis_server, run_id, batch_size=2)
    assert [it.meta["n"] for it in (await source.next_batch()).items] == [0, 1]
    await source._ahead  # type: ignore[misc]  # the read ahead of the cursor: entries 2 and 3
    state = source.state_dict()
    assert source.consumed == 2 and await source.stream.pending() == 2
    await _push(redis_server.url, run_id, [make_item(4)])  # after the read ahead: read later, in order
    source.batch_size = 3
    assert [it.meta["n"] for it in (await source.next_batch()).items] == [2, 3, 4]
    await source.close()
    assert source._ahead is None  # closing cancels a read in flight
    resumed = _source(redis_server, run_id, batch_size=3)
    resumed.load_state_dict(state)
    assert [it.meta["n"] for it in (await resumed.next_batch()).items] == [2, 3, 4]
    await resumed.close()


def _calls(client, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _xread_calls(client) -> int:
    return _calls(client, "xread")


@pytest.mark.parametrize("url_query", ["", "?socket_timeout=5"])
async def test_the_read_ahead_reaches_redis_before_the_batch_is_decoded(
    redis_server, run_id, make_item, url_query, monkeypatch
):
    """Redis must find the next entries while this process decodes the ones just received, with or without a
    socket timeout in the URL (under one, redis-py writes through a task of its own on Python 3.11, which
    held the XREAD back until the decoding was over). Decoding blocks the event loop, so only a read already
    sent can arrive while the first entry is decoded."""
    import time

    import redis

    import ludic.training.pipeline.batch_source as source_module

    client = redis.Redis.from_url(redis_server.url)
    seen: list[int] = []
    decode = source_module.decode_read

    def decode_watching_redis(entries, *args, **kw):
        if not seen:  # the first read: wait (blocking, as decoding does) for the read ahead to arrive
            deadline = time.monotonic() + 2.0
            while _xread_calls(client) < before + 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(_xread_calls(client))
        return decode(entries, *args, **kw)

    monkeypatch.setattr(source_module, "decode_read", decode_watching_redis)
    await _push(redis_server.url, run_id, [make_item(n) for n in range(4)])
    source = PipelineBatchSource(redis_url=redis_server.url + url_query, run_id=run_id, batch_size=2,
                                 vocab_size=1000, version_fn=lambda: 0, block_ms=50)  # fmt: skip
    try:
        before = _xread_calls(client)
        assert [it.meta["n"] for it in (await source.next_batch()).items] == [0, 1]
        assert seen == [before + 2]  # the first read, and the read ahead sent before decoding began
        assert [it.meta["n"] for it in (await source.next_batch()).items] == [2, 3]
    finally:
        await source.close()
        client.close()


async def test_the_read_ahead_carries_the_consumed_count_of_the_entries_it_follows(
    redis_server, run_id, make_item, monkeypatch
):
    """The SET of the consumed count goes out with the read-ahead, counting the entries being decoded (the
    batch takes them all), so a batch ends with nothing left to send; and actors never see it lag a batch."""
    import time

    import redis

    import ludic.training.pipeline.batch_source as source_module

    client = redis.Redis.from_url(redis_server.url)
    source = _source(redis_server, run_id, batch_size=2)
    seen: list[int] = []
    decode = source_module.decode_read

    def decode_reading_consumed(entries, *args, **kw):
        """Wait (blocking, as decoding does) for a count covering these entries; only one already sent arrives."""
        deadline = time.monotonic() + 2.0
        covering = source.consumed + len(entries)
        while int(client.get(source.stream.consumed_key) or 0) < covering and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(int(client.get(source.stream.consumed_key) or 0))
        return decode(entries, *args, **kw)

    monkeypatch.setattr(source_module, "decode_read", decode_reading_consumed)
    await _push(redis_server.url, run_id, [make_item(n) for n in range(4)])
    sets_before = _calls(client, "set")
    try:
        await source.next_batch()
        await source.next_batch()
        assert seen == [2, 4]  # published before the entries (a read of 2 per batch) were decoded
        # 0 before the first (blocking) read, then one per batch: none sent again at the end of a batch; and
        # the run's epoch, set by the first read
        assert _calls(client, "set") - sets_before == 3 + 1
        assert await source.stream.pending() == 0
    finally:
        await source.close()
        client.close()


async def test_duplicates_are_recognised_across_a_resume(redis_server, run_id, make_item):
    await _push(redis_server.url, run_id, [make_item(0)], ids=["same"])
    first = _source(redis_server, run_id, batch_size=1)
    await first.next_batch()
    state = first.state_dict()
    await first.close()
    await _push(redis_server.url, run_id, [make_item(0), make_item(1)], ids=["same", "new"])
    resumed = _source(redis_server, run_id, batch_size=1)
    resumed.load_state_dict(state)
    batch = await resumed.next_batch()
    assert [it.meta["pipeline_item_id"] for it in batch.items] == ["new"]
    assert resumed.counters["pipeline/skipped_duplicate"] == 1
    await resumed.close()


async def test_entries_are_trimmed_only_when_a_checkpoint_is_saved(redis_server, run_id, make_item):
    ids = await _push(redis_server.url, run_id, [make_item(n) for n in range(6)])
    source = _source(redis_server, run_id, batch_size=4)
    await source.next_batch()
    assert await source.stream.length() == 6  # read but not checkpointed: kept
    await source.on_checkpoint_saved(source.state_dict())
    assert await source.stream.length() == 2  # everything up to the cursor (ids[3]) is gone
    remaining = await source.stream.read("0-0", count=10, block_ms=10)
    assert [eid for eid, _ in remaining] == ids[4:]
    await source.close()


def test_invalid_arguments_are_refused(redis_server):
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        PipelineBatchSource(redis_url=redis_server.url, run_id="r", batch_size=1, vocab_size=10, max_staleness=-1)
    with pytest.raises(ValueError, match="run_id"):
        PipelineBatchSource(redis_url=redis_server.url, run_id="a:b", batch_size=1, vocab_size=10)


async def test_a_refused_push_lands_nothing_and_the_stream_goes_on(redis_server, run_id, make_item):
    """push/read speak RESP on a connection of their own: an error reply mid-transaction must leave
    nothing half-added and no unread reply behind to answer the next call."""
    import redis.asyncio as aioredis

    stream = PipelineStream(redis_server.url, run_id)
    other = aioredis.Redis.from_url(redis_server.url)
    await other.set(stream.items_key, "not a stream")  # every XADD on it fails: WRONGTYPE
    entries = [encode_item(make_item(n), run_id=run_id, item_id=f"item-{n}") for n in range(3)]
    with pytest.raises(RuntimeError, match="WRONGTYPE"):
        await stream.push(entries)
    await other.delete(stream.items_key, stream.pushed_key)
    # refused while queueing: EXEC never runs
    with pytest.raises(Exception, match="wrong number of arguments"):
        await stream.push([{"item": b"x"}, {}])
    assert await other.exists(stream.items_key) == 0 and await stream.pending() == 0  # nothing landed
    ids = await stream.push(entries)
    assert len(ids) == 3 and await stream.pending() == 3
    got = await stream.read("0-0", count=10, block_ms=10)
    assert [eid for eid, _ in got] == [i.decode() for i in ids] and got[0][1][b"item"] == entries[0]["item"]
    assert await stream.read(got[-1][0], count=10, block_ms=10) == []  # nil after BLOCK: empty, not an error
    await other.aclose()
    await stream.close()
