"""run_pipeline_actor with a real tiny model: pushes whole batches, admission control, back-pressure."""

from __future__ import annotations

import asyncio

from ludic.training.pipeline.actor import run_pipeline_actor
from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.stream import PipelineStream
from ludic.training.types import SAWBatch


async def _eventually(cond, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await cond():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_actor_pushes_credited_items_and_holds_back_beyond_max_staleness(
    redis_server, run_id, tiny_client, letter_source
):
    stream = PipelineStream(redis_server.url, run_id)
    actor = asyncio.create_task(run_pipeline_actor(
        source=letter_source(tiny_client), redis_url=redis_server.url, run_id=run_id,
        trainer_batch_size=8, max_staleness=1, num_batches=3,
    ))  # fmt: skip
    await _eventually(lambda: _eq(stream.pending(), 16))  # two batches of 2 prompts x 4 = (K+1) x 8
    await asyncio.sleep(0.3)
    assert not actor.done() and await stream.pending() == 16  # held back: a third would go stale
    source = PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=8, vocab_size=1000, version_fn=lambda: 0)
    batch = await source.next_batch()
    stats = await asyncio.wait_for(actor, 30)
    assert stats.batches == 3 and stats.items == 24
    assert stats.admission_wait_seconds > 0.0  # it did wait (the 0.3 s hold above proves the length)
    assert len(batch.items) == 8
    for item in batch.items:
        assert item.meta["policy_version"] == 0
        assert item.num_action_tokens == len(item.attachments.actor_logps.token_logps) > 0
    by_group: dict[str, float] = {}
    for item in batch.items:  # GRPO credit was assigned on the actor: weights centre on 0 per group
        gid = item.meta["request_meta"]["group_id"]
        by_group[gid] = by_group.get(gid, 0.0) + item.weight
    assert len(by_group) == 2 and all(abs(w) < 1e-5 for w in by_group.values())
    await source.close()
    await stream.close()


async def _eq(awaitable, value) -> bool:
    return await awaitable == value


async def test_full_stream_back_pressures_the_actor_until_a_checkpoint_trims(
    redis_server, run_id, tiny_client, letter_source
):
    stream = PipelineStream(redis_server.url, run_id)
    actor = asyncio.create_task(run_pipeline_actor(
        source=letter_source(tiny_client), redis_url=redis_server.url, run_id=run_id,
        trainer_batch_size=8, max_staleness=10, max_stream_len=8, num_batches=2,
    ))  # fmt: skip
    await _eventually(lambda: _eq(stream.length(), 8))
    source = PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=8, vocab_size=1000, version_fn=lambda: 0)
    await source.next_batch()  # consumed, but not yet covered by a checkpoint: the entries stay
    await asyncio.sleep(0.3)
    assert not actor.done() and await stream.length() == 8
    await source.on_checkpoint_saved(source.state_dict())
    stats = await asyncio.wait_for(actor, 30)
    assert stats.batches == 2 and stats.backpressure_wait_seconds > 0.0
    assert await stream.length() == 8
    await source.close()
    await stream.close()


async def test_actor_waits_for_weights_within_max_staleness_of_the_trainer(
    redis_server, run_id, tiny_client, letter_source
):
    stream = PipelineStream(redis_server.url, run_id)
    await stream.set_version(5)
    mine = {"version": 0}
    stop = asyncio.Event()
    actor = asyncio.create_task(run_pipeline_actor(
        source=letter_source(tiny_client), redis_url=redis_server.url, run_id=run_id,
        trainer_batch_size=8, max_staleness=1, num_batches=1, stop=stop,
        policy_version_fn=lambda: mine["version"],
    ))  # fmt: skip
    await asyncio.sleep(0.3)
    assert not actor.done() and await stream.length() == 0  # version 0 is 5 behind: do not generate
    mine["version"] = 4  # new weights arrived
    stats = await asyncio.wait_for(actor, 30)
    assert stats.batches == 1 and await stream.length() == 8
    await stream.close()


class _VersionedBatches:
    """A BatchSource of ready-made items: the batch at index k carries policy version ``versions[k]``."""

    def __init__(self, make_item, versions: list[int], size: int) -> None:
        self.make_item, self.versions, self.size, self.calls = make_item, versions, size, 0

    async def next_batch(self) -> SAWBatch:
        version = self.versions[min(self.calls, len(self.versions) - 1)]
        base, self.calls = self.calls * self.size, self.calls + 1
        return SAWBatch(items=[self.make_item(base + i, version=version) for i in range(self.size)])


async def test_a_trainer_waiting_on_a_part_batch_lets_actors_refill_it(redis_server, run_id, make_item):
    """Stale drops leave the trainer short of a batch while actors count the entries it has read as queued:
    the trainer must tell Redis what it consumed before it waits, or both wait for each other forever
    (``examples/pipeline_rl/run_local.py`` hung this way)."""
    source = PipelineBatchSource(
        redis_url=redis_server.url, run_id=run_id, batch_size=4, vocab_size=1000, max_staleness=0, version_fn=lambda: 1,
        block_ms=50,
    )
    actor = asyncio.create_task(run_pipeline_actor(
        source=_VersionedBatches(make_item, [1, 0, 0, 1], size=3), redis_url=redis_server.url, run_id=run_id,
        trainer_batch_size=4, max_staleness=0, num_batches=4, poll_s=0.01,
    ))  # fmt: skip
    # budget (0 + 1) x 4: the actor pushes a batch while pending + 3 <= 4; the 2nd and 3rd batches are stale
    batch = await asyncio.wait_for(source.next_batch(), 30)
    stats = await asyncio.wait_for(actor, 30)
    assert [it.meta["n"] for it in batch.items] == [0, 1, 2, 9]
    assert batch.meta["pipeline/dropped_stale"] == 6.0 and stats.batches == 4
    assert await source.stream.pending() == 2  # items 10 and 11: read ahead, not consumed
    await source.close()
