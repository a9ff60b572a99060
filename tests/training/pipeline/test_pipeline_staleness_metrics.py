"""Asynchrony measured: each batch's staleness histogram, and the share of a step spent waiting for data."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoModelForCausalLM

from ludic.testing import tiny_model_path
from ludic.timeouts import WaitTimeout
from ludic.training import Trainer, TrainerConfig, make_grpo
from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.codec import encode_item
from ludic.training.pipeline.staleness import staleness_histogram
from ludic.training.pipeline.stream import PipelineStream


async def _push(url: str, run_id: str, items) -> None:
    stream = PipelineStream(url, run_id)
    try:
        await stream.push([encode_item(it, run_id=run_id, item_id=f"item-{it.meta['n']}") for it in items])
    finally:
        await stream.close()


def _source(server, run_id, **kw) -> PipelineBatchSource:
    return PipelineBatchSource(redis_url=server.url, run_id=run_id, block_ms=50, vocab_size=1000, **kw)


async def test_a_batch_counts_its_items_by_versions_behind(redis_server, run_id, make_item):
    versions = [5, 4, 3, 5, 2, 4, None, 6]  # trainer at 5, max_staleness 2: the 2 is dropped
    await _push(redis_server.url, run_id, [make_item(n, version=v) for n, v in enumerate(versions)])
    source = _source(redis_server, run_id, batch_size=7, max_staleness=2, version_fn=lambda: 5)
    meta = (await source.next_batch()).meta
    hist = {k: v for k, v in meta.items() if k.startswith("pipeline/staleness/")}
    # 0: versions 5, 5, None (taken as current) and 6 (published after the batch read the version)
    assert hist == {"pipeline/staleness/0": 4.0, "pipeline/staleness/1": 2.0, "pipeline/staleness/2": 1.0}
    assert meta["pipeline/dropped_stale"] == 1.0
    assert meta["pipeline/mean_staleness"] == pytest.approx((0 + 1 + 2 + 0 + 1 + 0 - 1) / 7)
    await source.close()


async def test_items_gathered_before_a_wait_timeout_keep_their_staleness(redis_server, run_id, make_item):
    await _push(redis_server.url, run_id, [make_item(0, version=2), make_item(1, version=3)])
    source = _source(redis_server, run_id, batch_size=4, max_staleness=1, version_fn=lambda: 3, queue_wait_s=0.3)
    with pytest.raises(WaitTimeout):
        await source.next_batch()  # two of four: they stay for the next call
    await _push(redis_server.url, run_id, [make_item(2, version=3), make_item(3, version=2)])
    meta = (await source.next_batch()).meta
    assert (meta["pipeline/staleness/0"], meta["pipeline/staleness/1"]) == (2.0, 2.0)
    assert meta["pipeline/mean_staleness"] == 0.5
    await source.close()


def test_the_histogram_has_every_bucket_up_to_max_staleness() -> None:
    assert staleness_histogram([], 2) == {f"pipeline/staleness/{k}": 0.0 for k in range(3)}
    assert staleness_histogram([0, 0, -1], 0) == {"pipeline/staleness/0": 3.0}


async def test_the_trainer_reports_its_wait_for_data_and_the_histogram(redis_server, run_id, make_item):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    source = _source(redis_server, run_id, batch_size=4, max_staleness=1, version_fn=lambda: 1)
    trainer = Trainer(model=model, algo=make_grpo(group_size=4), batch_source=source,
                      cfg=TrainerConfig(lr=1e-4, max_seq_len=64, micro_token_budget=2048, pad_token_id=0))  # fmt: skip

    async def late_actor() -> None:  # the batch arrives 0.5 s into the step: the trainer waits for it
        await asyncio.sleep(0.5)
        await _push(redis_server.url, run_id, [make_item(n, version=[1, 0, 1, 1][n]) for n in range(4)])

    pusher = asyncio.create_task(late_actor())
    stats = await trainer.train_step()
    await pusher
    assert stats["time/wait_seconds"] >= 0.45
    assert stats["perf/wait_fraction"] == pytest.approx(stats["time/wait_seconds"] / stats["time/step_seconds"])
    assert 0.0 < stats["perf/wait_fraction"] <= 1.0
    assert (stats["train/pipeline/staleness/0"], stats["train/pipeline/staleness/1"]) == (3.0, 1.0)

    await _push(redis_server.url, run_id, [make_item(n, version=1) for n in range(4, 8)])  # ready in time
    stats = await trainer.train_step()
    assert stats["perf/wait_fraction"] < 0.45  # no actor to wait for: most of the step is the step itself
    assert stats["train/pipeline/staleness/0"] == 4.0
    await source.close()
