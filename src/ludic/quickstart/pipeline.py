"""The quickstart in pipeline mode: one actor task on the embedded engine, the trainer on the stream.

See ``ludic.training.batching.pipeline_local``; the private Redis lives in a temporary folder.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ludic.quickstart.config import QuickstartConfig


@contextlib.asynccontextmanager
async def pipeline_parts(cfg: QuickstartConfig, client: Any, actor_source: Any) -> AsyncIterator[Any]:
    """A ``LocalPipeline`` (``batch_source``, ``publisher``) for the quickstart's RL phase."""
    from ludic.training.batching.pipeline_local import local_pipeline

    # RL versions count RL steps (the trainer publishes version=step); the SFT warm start's publishes left
    # the engine at its own count, which would tag the first items as newer than the trainer.
    name, tensor = next(iter(client.model.state_dict().items()))
    client.sync_weights({name: tensor.clone()}, version=0)  # same weights, version reset
    async with local_pipeline(
        client=client,
        actor_sources=[actor_source],
        batch_size=cfg.group_size * cfg.prompts_per_step,
        max_staleness=cfg.max_staleness,
        run_id=f"quickstart-{uuid.uuid4().hex[:12]}",
        redis_url=cfg.redis_url,
    ) as parts:
        yield parts
