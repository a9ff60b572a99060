"""train_alongside: a failing actor stops training with its error instead of leaving the trainer waiting."""

from __future__ import annotations

import asyncio

import pytest

from ludic.training.pipeline.local import train_alongside


async def test_a_failed_actor_cancels_training_and_raises_its_error():
    waited = asyncio.Event()

    async def train():  # a trainer blocked on next_batch: nobody pushes any more
        waited.set()
        await asyncio.sleep(3600)

    async def actor():
        await waited.wait()
        raise ValueError("engine crashed")

    with pytest.raises(RuntimeError, match="actor failed") as info:
        await asyncio.wait_for(train_alongside(train(), [asyncio.create_task(actor())]), 10)
    assert isinstance(info.value.__cause__, ValueError)


async def test_training_result_is_returned_when_actors_keep_running():
    async def actor():
        await asyncio.sleep(3600)

    task = asyncio.create_task(actor())

    async def train():
        return {"train/loss": 0.5}

    assert await train_alongside(train(), [task]) == {"train/loss": 0.5}
    assert not task.done()
    task.cancel()
