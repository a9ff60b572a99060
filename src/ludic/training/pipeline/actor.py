"""The actor's side of pipeline RL: generate -> assign credit -> push, in a loop.

Generation and credit are whatever ``BatchSource`` the actor is given, usually a ``RolloutBatchSource``
whose agents talk to any ``ChatClient`` (the embedded engine, Ludic's HTTP server, vLLM); the client
picks up new weights as the trainer's publisher sends them. Every item is pushed with a fresh item id
in one MULTI/EXEC per batch, so a killed actor leaves either its whole batch (every GRPO group
complete) or none of it.

Admission control, before generating: wait while the items already queued would take the trainer more
than ``max_staleness`` + 1 steps to drain (``pending + last batch > (max_staleness + 1) * trainer
batch size``): what is generated then would be dropped as stale. Back-pressure, before writing: wait
while the stream holds ``max_stream_len`` entries or more (trimmed only at trainer checkpoints). Neither
wait is endless: past ``wait_s`` (``[timeouts].queue_wait_s``) the actor raises ``ludic.timeouts.WaitTimeout``
naming the trainer's stream, the wait and the counts it last saw (a trainer that stopped reading).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ludic.timeouts import Timeouts, WaitTimeout
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


async def _wait_until(
    cond: Callable[[], Awaitable[bool]], *, poll_s: float, stop: asyncio.Event, bound_s: float,
    timed_out: Callable[[float], WaitTimeout],
) -> float:  # fmt: skip
    t0 = time.perf_counter()
    while not stop.is_set() and not await cond():
        waited = time.perf_counter() - t0
        if waited >= bound_s:
            raise timed_out(waited)
        await asyncio.sleep(min(poll_s, bound_s - waited))
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
    wait_s: float = Timeouts.queue_wait_s,
    call_timeout_s: float | None = None,
    reconnect_timeout_s: float = Timeouts.redis_reconnect_s,
    on_push: Callable[[ActorStats, int], None] | None = None,
) -> ActorStats:
    """Push ``num_batches`` batches from ``source`` to the run's stream (None: until ``stop`` is set).

    ``policy_version_fn`` (e.g. ``client.get_policy_version``) is the actor's own weights' version:
    the actor also waits while it is more than ``max_staleness`` versions behind the trainer's
    announced version (new weights on their way). Items keep the version their client reported
    (``meta["policy_version"]``). ``wait_s`` bounds each admission and back-pressure wait;
    ``call_timeout_s`` / ``reconnect_timeout_s`` each Redis call (``PipelineStream``). ``on_push(stats,
    n)`` runs after each batch of ``n`` items is in the stream (``ludic actor`` prints a line).
    """
    if trainer_batch_size < 1 or max_staleness < 0 or max_stream_len < 1 or not wait_s > 0:
        raise ValueError(
            f"trainer_batch_size={trainer_batch_size} (>= 1), max_staleness={max_staleness} (>= 0), "
            f"max_stream_len={max_stream_len} (>= 1), wait_s={wait_s} (> 0)"
        )
    stream = PipelineStream(redis_url, run_id, call_timeout_s=call_timeout_s, reconnect_timeout_s=reconnect_timeout_s)
    peer = f"the trainer (Redis stream {stream.items_key!r} at {stream._safe_url()})"
    seen: dict[str, int] = {}  # what admission and room last saw, for the error
    stop = stop if stop is not None else asyncio.Event()
    stats = ActorStats()
    budget = (max_staleness + 1) * trainer_batch_size
    last_len = 0

    async def admitted() -> bool:
        seen["pending"] = await stream.pending()
        if seen["pending"] + last_len > budget:
            return False
        if policy_version_fn is None:
            return True
        mine = policy_version_fn()
        seen["actor_version"] = int(await mine if inspect.isawaitable(mine) else mine)
        seen["trainer_version"] = await stream.version()
        return seen["trainer_version"] - seen["actor_version"] <= max_staleness

    def timed_out(operation: str, rule: str) -> Callable[[float], WaitTimeout]:
        def error(waited: float) -> WaitTimeout:
            now = ", ".join(f"{k}={v}" for k, v in seen.items())
            return WaitTimeout(peer=peer, operation=operation, waited_s=waited, bound_s=wait_s,
                               detail=f"waiting until {rule}; last seen: {now}")  # fmt: skip

        return error

    try:
        while not stop.is_set() and (num_batches is None or stats.batches < num_batches):
            admission = timed_out("the actor waiting for admission", f"pending + last batch ({last_len}) <= "
                                  f"{budget} and trainer version - actor version <= {max_staleness}")  # fmt: skip
            stats.admission_wait_seconds += await _wait_until(
                admitted, poll_s=poll_s, stop=stop, bound_s=wait_s, timed_out=admission
            )
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
                seen["stream_length"] = await stream.length()
                return seen["stream_length"] + n <= max_stream_len

            full = timed_out("the actor waiting for room in the stream", f"length + {len(entries)} <= {max_stream_len}")
            stats.backpressure_wait_seconds += await _wait_until(
                room, poll_s=poll_s, stop=stop, bound_s=wait_s, timed_out=full
            )
            if stop.is_set():
                break
            ids = await stream.push(entries)
            stats.entry_ids.extend(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
            stats.item_ids.extend(item_ids)
            stats.batches += 1
            stats.items += len(entries)
            last_len = len(entries)
            if on_push is not None:
                on_push(stats, len(entries))
    finally:
        stats.reconnects = stream.reconnects
        await stream.close()
    return stats
