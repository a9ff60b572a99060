"""Pipeline RL on one machine, in one process: actor tasks and the trainer meet in a Redis stream.

Each actor task runs ``run_pipeline_actor`` on its own batch source (usually a ``RolloutBatchSource``
on the shared inference client); the trainer reads a ``PipelineBatchSource`` and publishes through a
``PipelineVersionPublisher`` wrapping the client's publisher. The actors share the trainer's event loop,
which the trainer's step holds, so generation and training still take turns here (measured in
bench/bench_pipeline.py); for overlap run actors as processes (examples/pipeline_rl/). Without
``redis_url`` a private server is started in ``redis_dir`` (append-only: a resumed run finds its
stream there) and stopped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.training.pipeline.actor import run_pipeline_actor
from ludic.training.pipeline.batch_source import PipelineBatchSource
from ludic.training.pipeline.version import PipelineVersionPublisher


@dataclass
class LocalPipeline:
    """What the Trainer is built with in pipeline mode, and the running actor tasks."""

    batch_source: PipelineBatchSource
    publisher: PipelineVersionPublisher
    actors: list[asyncio.Task]
    redis_url: str


@contextlib.asynccontextmanager
async def local_pipeline(
    *,
    client: Any,
    actor_sources: Sequence[Any],
    batch_size: int,
    vocab_size: int,
    max_staleness: int = 1,
    run_id: str = "local",
    redis_url: str | None = None,
    redis_dir: str | Path | None = None,
    inner_publisher: Any = None,
) -> AsyncIterator[LocalPipeline]:
    """Start Redis (unless ``redis_url``) and one actor task per source; stop them when the block ends.

    ``vocab_size``: the model's input embedding rows (items with other token ids are refused);
    ``inner_publisher`` defaults to ``ClientPublisher(client)``.
    """
    from ludic.distributed import ClientPublisher
    from ludic.training.pipeline.redis_server import RedisServer

    server = None if redis_url else RedisServer(data_dir=redis_dir).start()
    url = redis_url or server.url  # type: ignore[union-attr]
    stop = asyncio.Event()
    actors = [
        asyncio.create_task(
            run_pipeline_actor(
                source=actor_source,
                redis_url=url,
                run_id=run_id,
                trainer_batch_size=batch_size,
                max_staleness=max_staleness,
                stop=stop,
                policy_version_fn=client.get_policy_version,
            )
        )
        for actor_source in actor_sources
    ]
    source = PipelineBatchSource(
        redis_url=url,
        run_id=run_id,
        batch_size=batch_size,
        vocab_size=vocab_size,
        max_staleness=max_staleness,
    )
    inner = inner_publisher if inner_publisher is not None else ClientPublisher(client)
    publisher = PipelineVersionPublisher(inner, redis_url=url, run_id=run_id)
    try:
        yield LocalPipeline(batch_source=source, publisher=publisher, actors=actors, redis_url=url)
    finally:
        stop.set()
        try:
            await asyncio.wait_for(asyncio.gather(*actors, return_exceptions=True), timeout=120)
        finally:
            await source.close()
            if server is not None:
                server.stop()


async def train_alongside(train: Awaitable[Any], actors: Sequence[asyncio.Task]) -> Any:
    """Await ``train`` (e.g. ``trainer.train(n)``); if an actor task fails first, cancel training and raise
    the actor's error (the trainer would otherwise wait for items no one will push)."""
    train_task = asyncio.ensure_future(train)
    pending = {train_task, *actors}
    while True:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if train_task in done:
            return train_task.result()
        for task in done:
            if task.exception() is not None:
                train_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await train_task
                raise RuntimeError("a pipeline actor failed; training stopped") from task.exception()
