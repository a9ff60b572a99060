"""``ludic train`` in pipeline mode: the trainer reads a Redis stream that actor tasks write.

``build_pipeline_mode`` (sync, before the Trainer exists) starts the private Redis when no
``[pipeline].redis_url`` is given and makes the trainer's batch source and publisher;
``running_actors`` (async, around ``trainer.train``) runs ``[pipeline].actors`` actor tasks, each on
its own stretch of env seeds, and stops them afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.config import RunConfig

ACTOR_SEED_STRIDE = 10_000_000
"""Actor i plays env seeds from ``[rollout].seed + i * ACTOR_SEED_STRIDE`` (disjoint stretches)."""


@dataclass
class PipelineMode:
    """The live pieces of pipeline mode."""

    redis_url: str
    server: Any
    batch_source: Any
    publisher: Any

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def redis_bounds(cfg: RunConfig) -> dict[str, float]:
    """Each Redis call's bounds from ``[timeouts]`` (``PipelineStream``'s keywords)."""
    return {"call_timeout_s": cfg.timeouts.redis_s, "reconnect_timeout_s": cfg.timeouts.redis_reconnect_s}


def redis_dir(cfg: RunConfig) -> Path:
    return Path(cfg.logging.output_dir) / "redis"


def build_pipeline_mode(cfg: RunConfig, inner_publisher: Any, *, vocab_size: int) -> PipelineMode:
    """Redis (private unless ``redis_url`` or ``[cluster]``), the trainer's ``PipelineBatchSource`` and publisher.

    ``vocab_size``: the trained model's input embedding rows; stream items with other token ids are
    refused (counted as ``pipeline/skipped_out_of_vocab``) instead of crashing the step."""
    from ludic.training.pipeline import PipelineBatchSource, PipelineVersionPublisher
    from ludic.training.pipeline.redis_server import RedisServer

    p = cfg.pipeline
    given = p.redis_url
    if cfg.cluster is not None:  # the cluster's Redis, its password from [cluster].redis_password_env
        from ludic.cli.distributed_run import cluster_redis_url

        given = cluster_redis_url(cfg.cluster)
    server = None if given else RedisServer(data_dir=redis_dir(cfg)).start()
    url = given or server.url  # type: ignore[union-attr]
    batch_size = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    source = PipelineBatchSource(
        redis_url=url, run_id=p.run_id, batch_size=batch_size, vocab_size=vocab_size,
        max_staleness=p.max_staleness, on_stream_reset=p.on_stream_reset, **redis_bounds(cfg),
        queue_wait_s=cfg.timeouts.queue_wait_s,
    )  # fmt: skip
    publisher = PipelineVersionPublisher(inner_publisher, redis_url=url, run_id=p.run_id, **redis_bounds(cfg))
    return PipelineMode(redis_url=url, server=server, batch_source=source, publisher=publisher)


@contextlib.asynccontextmanager
async def running_actors(
    cfg: RunConfig, mode: PipelineMode, client: Any, make_source: Callable[[int], Any]
) -> AsyncIterator[list[asyncio.Task]]:
    """``[pipeline].actors`` tasks of ``run_pipeline_actor`` (none with ``[cluster]``: its actors run on their own
    hosts); ``make_source(first_seed)`` builds each one's."""
    from ludic.training.pipeline import run_pipeline_actor

    stop = asyncio.Event()
    batch_size = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    count = 0 if cfg.cluster is not None else cfg.pipeline.actors  # [cluster]: `ludic actor` on other hosts
    tasks = [
        asyncio.create_task(
            run_pipeline_actor(
                source=make_source(cfg.rollout.seed + i * ACTOR_SEED_STRIDE),
                redis_url=mode.redis_url,
                run_id=cfg.pipeline.run_id,
                trainer_batch_size=batch_size,
                max_staleness=cfg.pipeline.max_staleness,
                stop=stop,
                policy_version_fn=client.get_policy_version,
                wait_s=cfg.timeouts.queue_wait_s,
                **redis_bounds(cfg),
            )
        )
        for i in range(count)
    ]
    try:
        yield tasks
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=300)
