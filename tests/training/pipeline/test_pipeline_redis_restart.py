"""Redis killed and restarted mid-run: actor and trainer reconnect, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio

from ludic.training.pipeline import PipelineBatchSource, run_pipeline_actor
from ludic.training.pipeline.redis_server import RedisServer


async def test_redis_restart_mid_run_loses_nothing_and_both_sides_reconnect(
    tmp_path, run_id, tiny_client, letter_source
):
    server = RedisServer(data_dir=tmp_path / "redis", fsync="always").start()
    try:
        stop = asyncio.Event()
        actor = asyncio.create_task(run_pipeline_actor(
            source=letter_source(tiny_client), redis_url=server.url, run_id=run_id,
            trainer_batch_size=8, max_staleness=1, num_batches=6, stop=stop,
        ))  # fmt: skip
        source = PipelineBatchSource(redis_url=server.url, run_id=run_id, batch_size=8, vocab_size=1000,
                                     version_fn=lambda: 0)
        trained = [it.meta["pipeline_item_id"] for it in (await source.next_batch()).items]
        server.kill()  # SIGKILL: what survives is what the append-only file holds
        await asyncio.sleep(0.5)  # both sides hit a dead server meanwhile
        server.start()
        for _ in range(5):
            trained += [it.meta["pipeline_item_id"] for it in (await source.next_batch()).items]
        stats = await asyncio.wait_for(actor, 60)
        assert stats.batches == 6
        assert trained == stats.item_ids  # every acknowledged item, once, in order
        assert source.stream.reconnects >= 1 and stats.reconnects >= 1
        # A push whose EXEC Redis applied (and fsynced) but whose reply the kill cut off is retried by the
        # actor: that copy is a duplicate, recognised by item id and skipped (counted), never trained twice.
        assert source.counters.get("pipeline/skipped_duplicate", 0) in (0, 8)
        await source.close()
    finally:
        server.close()


async def test_a_count_sent_while_redis_is_down_reaches_the_restarted_server(tmp_path, run_id):
    """If Redis dies before the trainer's consumed count reaches it, the count must reach the restarted
    server (else actors would wait on a stale count for ever)."""
    from ludic.training.pipeline import PipelineStream

    server = RedisServer(data_dir=tmp_path / "redis", fsync="always").start()
    try:
        stream = PipelineStream(server.url, run_id)
        assert await stream.pending() == 0  # the connection is open
        server.kill()
        sent = asyncio.ensure_future(stream.set_consumed(7))  # into the dead connection
        await asyncio.sleep(0.2)
        server.start()
        await sent
        assert await stream.pending() == -7  # 0 pushed, 7 consumed: the SET was sent again
        await stream.close()
    finally:
        server.close()
