"""The quickstart in pipeline mode, on one machine: an actor task and the trainer meet in Redis.

The actor (``run_pipeline_actor``) plays GRPO groups on the embedded engine, assigns credit and pushes
SAW items to a private Redis stream; the trainer pops them with ``PipelineBatchSource(max_staleness=K)``
and publishes weights to the same engine, announcing each version on the stream. Generation decodes
on a worker thread, so it overlaps the trainer's step instead of taking turns with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ludic.quickstart.config import QuickstartConfig


@dataclass
class PipelineParts:
    """What the Trainer is built with in pipeline mode."""

    batch_source: Any
    publisher: Any
    actor: asyncio.Task


@contextlib.asynccontextmanager
async def pipeline_parts(
    cfg: QuickstartConfig, client: Any, actor_source: Any
) -> AsyncIterator[PipelineParts]:
    """Start Redis (unless ``cfg.redis_url``) and the actor; stop both when the block ends."""
    from ludic.distributed import ClientPublisher
    from ludic.distributed.redis_server import RedisServer
    from ludic.training.batching import PipelineBatchSource, PipelineVersionPublisher, run_pipeline_actor

    server = None if cfg.redis_url else RedisServer().start()
    url = cfg.redis_url or server.url  # type: ignore[union-attr]
    run_id = f"quickstart-{uuid.uuid4().hex[:12]}"
    batch_size = cfg.group_size * cfg.prompts_per_step
    stop = asyncio.Event()
    actor = asyncio.create_task(
        run_pipeline_actor(
            source=actor_source, redis_url=url, run_id=run_id, trainer_batch_size=batch_size,
            max_staleness=cfg.max_staleness, stop=stop, policy_version_fn=client.get_policy_version,
        )
    )  # fmt: skip
    source = PipelineBatchSource(
        redis_url=url, run_id=run_id, batch_size=batch_size, max_staleness=cfg.max_staleness
    )
    publisher = PipelineVersionPublisher(ClientPublisher(client), redis_url=url, run_id=run_id)
    try:
        yield PipelineParts(batch_source=source, publisher=publisher, actor=actor)
    finally:
        stop.set()
        try:
            await asyncio.wait_for(actor, timeout=120)
        finally:
            await source.close()
            if server is not None:
                server.close()
