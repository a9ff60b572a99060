"""The actor's side of pipeline RL: generate -> assign credit -> push, in a loop.

Generation and credit are whatever ``BatchSource`` the actor is given, usually a ``RolloutBatchSource``
whose agents talk to any ``ChatClient`` (the embedded engine, Ludic's HTTP server, vLLM); the client
picks up new weights as the trainer's publisher sends them. Every item is pushed with a fresh item id
in one MULTI/EXEC per batch, so a killed actor leaves either its whole batch (every GRPO group
complete) or none of it.

Admission control, before generating: wait while the items already queued would take the trainer more
than ``max_staleness`` + 1 steps to drain (``pending + last batch > (max_staleness + 1) * trainer
batch size``): what is generated then would be dropped as stale. Back-pressure, before writing: wait
while the stream holds ``max_stream_len`` entries or more (trimmed only at trainer checkpoints).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ludic.training.pipeline.codec import encode_item
from ludic.training.pipeline.stream import PipelineStream
from ludic.training.types import BatchSource

log = logging.getLogger(__name__)


@dataclass
class ActorStats:
    """What one ``run_pipeline_actor`` call did."""

    batches: int = 0
    items: int = 0
    admission_wait_seconds: float = 0.0
    backpressure_wait_seconds: float = 0.0
    generate_seconds: float = 0.0
    reconnects: int = 0
    entry_ids: list[str] = field(default_factory=list)
    item_ids: list[str] = field(default_factory=list)  # ids of the items behind ``entry_ids``, in order


async def _wait_until(cond: Callable[[], Awaitable[bool]], *, poll_s: float, stop: asyncio.Event) -> float:
    t0 = time.perf_counter()
    while not stop.is_set() and not await cond():
        await asyncio.sleep(poll_s)
    return time.perf_counter() - t0


async def run_pipeline_actor(
    *,
    source: BatchSource,
    redis_url: str,
    run_id: str,
    trainer_batch_size: int,
    max_staleness: int = 1,
    max_stream_len: int = 100_000,
    num_batches: int | None = None,
    stop: asyncio.Event | None = None,
    poll_s: float = 0.02,
    policy_version_fn: Callable[[], int | Awaitable[int]] | None = None,
) -> ActorStats:
    """Push ``num_batches`` batches from ``source`` to the run's stream (None: until ``stop`` is set).

    ``policy_version_fn`` (e.g. ``client.get_policy_version``) is the actor's own weights' version:
    the actor also waits while it is more than ``max_staleness`` versions behind the trainer's
    announced version (new weights on their way). Items keep the version their client reported
    (``meta["policy_version"]``).
    """
    if trainer_batch_size < 1 or max_staleness < 0 or max_stream_len < 1:
        raise ValueError(
            f"trainer_batch_size={trainer_batch_size} (>= 1), max_staleness={max_staleness} (>= 0), "
            f"max_stream_len={max_stream_len} (>= 1)"
        )
    stream = PipelineStream(redis_url, run_id)
    stop = stop if stop is not None else asyncio.Event()
    stats = ActorStats()
    budget = (max_staleness + 1) * trainer_batch_size
    last_len = 0

    async def admitted() -> bool:
        if await stream.pending() + last_len > budget:
            return False
        if policy_version_fn is None:
            return True
        mine = policy_version_fn()
        mine = await mine if inspect.isawaitable(mine) else mine
        return await stream.version() - int(mine) <= max_staleness

    try:
        while not stop.is_set() and (num_batches is None or stats.batches < num_batches):
            stats.admission_wait_seconds += await _wait_until(admitted, poll_s=poll_s, stop=stop)
            if stop.is_set():
                break
            t0 = time.perf_counter()
            batch = await source.next_batch()
            stats.generate_seconds += time.perf_counter() - t0
            item_ids = [uuid.uuid4().hex for _ in batch.items]
            entries = [encode_item(it, run_id=run_id, item_id=i) for it, i in zip(batch.items, item_ids, strict=True)]
            if not entries:
                continue

            async def room(n: int = len(entries)) -> bool:
                return await stream.length() + n <= max_stream_len

            stats.backpressure_wait_seconds += await _wait_until(room, poll_s=poll_s, stop=stop)
            if stop.is_set():
                break
            ids = await stream.push(entries)
            stats.entry_ids.extend(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
            stats.item_ids.extend(item_ids)
            stats.batches += 1
            stats.items += len(entries)
            last_len = len(entries)
    finally:
        stats.reconnects = stream.reconnects
        await stream.close()
    return stats
