"""Redis restarted empty (its data lost) under a trainer: a clear error with the counts, not silent loss."""

from __future__ import annotations

import logging
import shutil

import pytest

from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.codec import encode_item
from ludic.training.pipeline.redis_server import RedisServer
from ludic.training.pipeline.stream import PipelineStream, StreamResetError


async def _push(url: str, run_id: str, make_item, numbers) -> None:
    stream = PipelineStream(url, run_id)
    await stream.push([encode_item(make_item(n), run_id=run_id, item_id=f"item-{n}") for n in numbers])
    await stream.close()


def _source(server: RedisServer, run_id: str, **kw) -> PipelineBatchSource:
    return PipelineBatchSource(
        redis_url=server.url,
        run_id=run_id,
        batch_size=4,
        vocab_size=1000,
        version_fn=lambda: 0,
        block_ms=50,
        **kw,
    )


def _restart_empty(server: RedisServer) -> None:
    """Stop Redis, lose its append-only data, start it again on the same port and password."""
    server.stop()
    shutil.rmtree(server.data_dir)
    server.start()


@pytest.fixture
def server(tmp_path):
    server = RedisServer(data_dir=tmp_path / "redis", fsync="always").start()
    yield server
    server.close()


async def test_a_trainer_reading_when_redis_restarts_empty_raises_with_the_counts(server, run_id, make_item):
    await _push(server.url, run_id, make_item, range(12))
    source = _source(server, run_id)
    assert [it.meta["n"] for it in (await source.next_batch()).items] == [0, 1, 2, 3]
    _restart_empty(server)  # items 8-11, pushed and not consumed, are gone (4-7 were read ahead: in memory)
    await _push(server.url, run_id, make_item, range(12, 16))
    assert [it.meta["n"] for it in (await source.next_batch()).items] == [4, 5, 6, 7]
    with pytest.raises(StreamResetError, match="consumed 8 entries") as info:
        await source.next_batch()  # before: trained on 12-15 as if 8-11 had never been pushed
    assert "pushed=4" in str(info.value) and "stream length=4" in str(info.value)
    await source.close()


async def test_a_resume_against_an_emptied_redis_raises(server, run_id, make_item):
    await _push(server.url, run_id, make_item, range(8))
    first = _source(server, run_id)
    await first.next_batch()
    state = first.state_dict()  # what the checkpoint holds
    await first.close()
    _restart_empty(server)
    await _push(server.url, run_id, make_item, range(8, 12))
    resumed = _source(server, run_id)
    resumed.load_state_dict(state)
    with pytest.raises(StreamResetError, match="Redis lost run"):
        await resumed.next_batch()
    await resumed.close()


async def test_on_stream_reset_warn_logs_counts_and_reads_the_new_stream_from_its_start(
    server, run_id, make_item, caplog
):
    await _push(server.url, run_id, make_item, range(12))
    source = _source(server, run_id, on_stream_reset="warn")
    await source.next_batch()
    _restart_empty(server)
    await _push(server.url, run_id, make_item, range(12, 16))
    await source.next_batch()  # 4-7, read ahead before the restart
    with caplog.at_level(logging.ERROR, logger="ludic.training.pipeline.batch_source"):
        batch = await source.next_batch()
    assert [it.meta["n"] for it in batch.items] == [12, 13, 14, 15]
    assert batch.meta["pipeline/stream_resets"] == 1.0
    assert any("consumed 8 entries" in r.getMessage() for r in caplog.records)
    assert source.consumed == 4 and await source.stream.pending() == 0  # counted afresh with the new stream
    await source.close()


async def test_a_restart_that_keeps_the_data_is_not_a_reset(server, run_id, make_item):
    await _push(server.url, run_id, make_item, range(8))
    source = _source(server, run_id)
    await source.next_batch()
    server.restart()  # graceful: the append-only file keeps the stream and its epoch
    assert [it.meta["n"] for it in (await source.next_batch()).items] == [4, 5, 6, 7]
    await source.close()
