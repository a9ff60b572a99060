"""The trainer's side of pipeline RL: macro-batches read from the run's Redis stream.

Delivery: the source reads the stream in id order from a cursor (the id of the last entry it consumed).
The cursor, the consumed count and the ids of recently trained items go into every trainer checkpoint
(``state_dict``); a resumed trainer reads on from the checkpoint's cursor, so an item trained in a step
the checkpoint covers is never read again, and one trained only in steps lost with a crash is read
again (the model those steps produced was lost too). Entries are trimmed (``XTRIM MINID``) only in
``on_checkpoint_saved``, after the checkpoint covering them is on disk. Actors may write an item twice
(a retried XADD whose reply was lost): the copy is recognised by its item id and skipped.

Skipped entries are counted by reason in ``counters`` (``pipeline/skipped_<reason>``) and logged once
each with the reason; items more than ``max_staleness`` policy versions behind the trainer are dropped
and counted as ``pipeline/dropped_stale``. Both appear in every batch's ``meta``, with
``pipeline/wait_seconds``: how long that ``next_batch`` kept the trainer (waiting for and decoding items),
and ``pipeline/staleness/<k>``: the batch's items by how many versions behind they were sampled.
An entry that decodes but would break the step (a token id outside the model's vocabulary, an extreme
weight, a bad sampling temperature, ``top_p < 1``: ``checks``) is refused the same way, so one bad
entry fails only itself; its cursor is passed like any other, so it is trimmed and a resume never reads it.

Every read also reads the run's epoch (a token set once in Redis): a new one means Redis lost the run's
keys (restarted empty, or another server) and the items pushed but not consumed with them. By default
that raises ``StreamResetError`` with the counts; ``on_stream_reset="warn"`` logs it, counts it
(``pipeline/stream_resets``) and reads the new stream from its start.

Waiting is bounded: when no new entry has arrived for ``queue_wait_s`` (``[timeouts].queue_wait_s``) while a
batch is still short, ``next_batch`` raises ``ludic.timeouts.WaitTimeout`` naming the stream, the items it has
and the counts Redis holds (pushed, consumed, pending); the items it had gathered stay for the next call.
Each Redis call has its own bound (``call_timeout_s``, ``reconnect_timeout_s``: ``PipelineStream``).

Read-ahead: as soon as a reply arrives, the next XREAD (after the last entry fetched, without BLOCK) is
sent before the entries just received are decoded, so Redis finds and sends the next entries while this
process checks these; at most one read is in flight. The same write (one redis-py pipeline) SETs the
consumed count actors read, as it will be once those entries are consumed. Entries fetched but not yet consumed are held in memory
only: the cursor (and so every checkpoint) covers consumed entries alone, and a resumed trainer reads the
rest again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from ludic.timeouts import Timeouts, WaitTimeout
from ludic.training.pipeline.checks import EntryLimits, refusals
from ludic.training.pipeline.read_decoder import decode_read
from ludic.training.pipeline.staleness import staleness_histogram
from ludic.training.pipeline.stream import PipelineStream, StreamResetError
from ludic.training.types import SAWBatch, SAWItem

log = logging.getLogger(__name__)
START = "0-0"
RECENT_IDS_KEPT = 4096
"""Item ids remembered (and checkpointed) for duplicate detection."""


class PipelineBatchSource:
    """``next_batch()`` -> the next ``batch_size`` fresh, well-formed items from the stream.

    ``version_fn`` gives the trainer's current policy version (sync or async); by default the version
    last published to the stream by ``PipelineVersionPublisher``. ``max_staleness=0`` trains only on
    items sampled by the current policy (synchronous training). ``vocab_size``: the model's input embedding
    rows (``model.get_input_embeddings().num_embeddings``); items with other token ids are refused.
    ``allow_nucleus``: take items sampled with ``top_p < 1`` (losses without importance ratios only).
    ``on_stream_reset``: ``"raise"`` (default) or ``"warn"`` when Redis lost the run's stream.
    """

    def __init__(
        self,
        *,
        redis_url: str,
        run_id: str,
        batch_size: int,
        vocab_size: int,
        max_staleness: int = 1,
        allow_nucleus: bool = False,
        on_stream_reset: str = "raise",
        version_fn: Callable[[], int | Awaitable[int]] | None = None,
        block_ms: int = 1000,
        reconnect_timeout_s: float = Timeouts.redis_reconnect_s,
        call_timeout_s: float | None = None,
        queue_wait_s: float = Timeouts.queue_wait_s,
    ) -> None:
        if queue_wait_s <= 0:
            raise ValueError(f"queue_wait_s must be > 0 seconds, got {queue_wait_s!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 (0 = synchronous), got {max_staleness!r}")
        if on_stream_reset not in ("raise", "warn"):
            raise ValueError(f"on_stream_reset must be 'raise' or 'warn', got {on_stream_reset!r}")
        self.limits = EntryLimits(vocab_size, allow_nucleus=allow_nucleus)
        self.on_stream_reset = on_stream_reset
        self.stream = PipelineStream(
            redis_url, run_id, reconnect_timeout_s=reconnect_timeout_s, call_timeout_s=call_timeout_s
        )
        self.queue_wait_s = queue_wait_s
        # a batch's items gathered before a WaitTimeout, and each one's staleness
        self._partial: tuple[list[SAWItem], list[int]] = ([], [])
        self._run = run_id.encode()
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.version_fn = version_fn
        self.block_ms = block_ms
        self.last_id = START
        self.consumed = 0
        # the consumed count Redis holds, as last sent (None: unknown)
        self._consumed_published: int | None = None
        self.counters: dict[str, int] = {"pipeline/dropped_stale": 0}
        self._recent: OrderedDict[str, None] = OrderedDict()
        self.wait_seconds = 0.0  # total time spent in next_batch
        self._fetched: list[Any] = []  # entries read ahead of the cursor (as Redis sends them), not consumed
        self._ahead: asyncio.Task | None = None  # the read after the last fetched entry, in flight
        self.epoch: bytes | None = None  # the run's epoch in Redis as first read (None: not read yet)
        self._epoch_token = secrets.token_hex(8).encode()  # what this source sets where Redis has none

    async def _trainer_version(self) -> int:
        if self.version_fn is None:
            return await self.stream.version()
        value = self.version_fn()
        return int(await value) if inspect.isawaitable(value) else int(value)

    async def next_batch(self) -> SAWBatch:
        t0 = time.perf_counter()
        version = await self._trainer_version()
        (items, staleness), self._partial = self._partial, ([], [])
        last_entry = time.monotonic()
        while len(items) < self.batch_size:
            entries = await self._entries(self.batch_size - len(items))
            staleness += self._consume(entries, version, items)
            if entries:
                last_entry = time.monotonic()
            elif time.monotonic() - last_entry >= self.queue_wait_s:
                self._partial = (items, staleness)
                raise await self._starved(time.monotonic() - last_entry, len(items))
        await self._publish_consumed()
        meta: dict[str, Any] = {k: float(v) for k, v in self.counters.items()}
        meta["pipeline/trainer_version"] = float(version)
        meta["pipeline/mean_staleness"] = sum(staleness) / len(items)
        meta |= staleness_histogram(staleness, self.max_staleness)
        meta["pipeline/last_id"] = self.last_id
        waited = time.perf_counter() - t0
        self.wait_seconds += waited
        meta["pipeline/wait_seconds"] = waited
        return SAWBatch(items=items, meta=meta)

    async def _starved(self, waited_s: float, have: int) -> WaitTimeout:
        """The error of a batch that got no new entry for ``queue_wait_s``: what Redis holds says which side
        is stuck (nothing pushed: the actors; pushed but unread: this reader)."""
        await self._publish_consumed()  # actors' admission counts from it: say what was read
        counts = await self.stream.counts()
        pending = counts["pushed"] - counts["consumed"]
        return WaitTimeout(
            peer=f"the actors (Redis stream {self.stream.items_key!r} at {self.stream._safe_url()})",
            operation="the trainer waiting for its next batch", waited_s=waited_s, bound_s=self.queue_wait_s,
            detail=f"{have} of {self.batch_size} items so far, none new since; Redis holds pushed={counts['pushed']}, "
            f"consumed={counts['consumed']}, pending={pending}, stream length={counts['length']}; dropped as stale "
            f"so far: {self.counters.get('pipeline/dropped_stale', 0)}",
        )  # fmt: skip

    async def _entries(self, count: int) -> list[Any]:
        """The next ``count`` entries after the cursor (fewer when no more came within ``block_ms``), with the
        read after them sent before they are returned."""
        if not self._fetched and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._fetched = await self._same_epoch(await ahead)
        if not self._fetched:  # a blocking read, carrying the consumed count where Redis lacks it
            sent = self.consumed
            consumed = sent if sent != self._consumed_published else None  # see _publish_consumed
            reply = await self._read(self.last_id, count=max(count, self.batch_size), block_ms=self.block_ms,
                                     consumed=consumed)  # fmt: skip
            self._consumed_published = sent
            self._fetched = await self._same_epoch(reply)
        entries, self._fetched = self._fetched[:count], self._fetched[count:]
        if entries and not self._fetched and self._ahead is None:
            after = entries[-1][0].decode()
            consumed = self.consumed + len(entries)  # once these are consumed: see _publish_consumed
            read = self._read(after, count=self.batch_size, block_ms=None, consumed=consumed)
            self._ahead, self._consumed_published = asyncio.create_task(read), consumed
            await asyncio.sleep(0)  # the task sends its SET and XREAD now and waits for the replies
        return entries

    def _read(self, after: str, **kw: Any) -> Awaitable[tuple[bytes | None, list[Any]]]:
        new = self._epoch_token if self.epoch is None else None  # the first read (or after a reset) sets one
        return self.stream.read_checked(after, read_epoch=True, set_epoch=new, **kw)

    async def _same_epoch(self, read: tuple[bytes | None, list[Any]]) -> list[Any]:
        """The entries of a read, after checking they come from the stream this source has been reading
        (the run's epoch unchanged); [] after a reset accepted with ``on_stream_reset="warn"``."""
        epoch, entries = read
        if epoch == self.epoch or (self.epoch is None and epoch is not None):
            self.epoch = epoch
            return entries
        counts = await self.stream.counts()
        message = (
            f"pipeline: Redis lost run {self.stream.run_id!r}'s stream (restarted empty, or another server): "
            f"this trainer has consumed {self.consumed} entries, up to {self.last_id}, but Redis now holds "
            f"pushed={counts['pushed']}, consumed={counts['consumed']}, stream length={counts['length']} under "
            "a new epoch; the items pushed and not yet consumed before are lost. Restart Redis on its "
            "append-only data dir (RedisServer(data_dir=...)) to get them back, or build the "
            "PipelineBatchSource with on_stream_reset='warn' to go on with what Redis holds now"
        )
        if self.on_stream_reset == "raise":
            raise StreamResetError(message)
        log.error("%s (going on: reading the new stream from its start)", message)
        self._count("pipeline/stream_resets")
        await self._drop_read_ahead()
        # the new stream's counters start at 0: so does the consumed count actors compare with them; the
        # next read sets a new epoch where there is none
        self.epoch, self.last_id, self.consumed, self._consumed_published = epoch, START, 0, None
        return []

    async def _publish_consumed(self) -> None:
        """Tell actors how many entries this source has consumed (their admission counts the rest as queued).

        Sent after each batch and with each blocking read (in the read's own write, ``_entries``): a trainer
        one batch short (its stale items dropped) that waited without saying what it had read would leave
        actors counting those entries as queued and holding back, each side waiting for the other. The
        read-ahead carries the count as it will be once the entries just handed out are consumed
        (``next_batch`` consumes every entry it takes), so after a batch there is usually nothing left to
        send."""
        if self.consumed != self._consumed_published:
            await self.stream.set_consumed(self.consumed)
            self._consumed_published = self.consumed

    async def _drop_read_ahead(self) -> None:
        ahead, self._ahead, self._fetched = self._ahead, None, []
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(BaseException):
                await ahead

    def _consume(self, entries: list[Any], version: int, items: list[SAWItem]) -> list[int]:
        """Advance the cursor past ``entries`` (``[id, fields]`` as Redis sends them), one at a time, appending
        each to be trained on to ``items``; the staleness of each item appended."""
        recent, staleness = self._recent, []
        decoded = decode_read(entries, self._run)
        verdicts = iter(refusals([d[2] for d in decoded if type(d) is tuple], self.limits))
        for (raw_id, _), result in zip(entries, decoded, strict=True):
            entry_id = raw_id.decode()
            self.last_id = entry_id
            self.consumed += 1
            refused = result if type(result) is not tuple else next(verdicts)
            if refused is not None:
                self._count(f"pipeline/skipped_{refused.reason}")
                log.warning("pipeline: skipped stream entry %s (%s)", entry_id, refused)
                continue
            item_id, policy_version, item = result
            if item_id in recent:
                self._count("pipeline/skipped_duplicate")
                log.warning("pipeline: skipped stream entry %s (duplicate of item %s)", entry_id, item_id)
                continue
            recent[item_id] = None
            if len(recent) > RECENT_IDS_KEPT:
                recent.popitem(last=False)
            if policy_version is None:
                policy_version = version
            elif version - policy_version > self.max_staleness:
                self._count("pipeline/dropped_stale")
                continue
            item.meta["pipeline_entry_id"] = entry_id
            item.meta["pipeline_item_id"] = item_id
            items.append(item)
            staleness.append(version - policy_version)
        return staleness

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    # ---- checkpoint protocol (the Trainer saves/restores any batch source that has these) --------
    def state_dict(self) -> dict[str, Any]:
        return {
            "last_id": self.last_id,
            "consumed": self.consumed,
            "recent_ids": list(self._recent),
            "counters": dict(self.counters),
            "epoch": None if self.epoch is None else self.epoch.decode(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._ahead is not None:  # read after the old cursor: its reply is of no use now
            self._ahead.cancel()
        self._ahead, self._fetched, self._partial = None, [], ([], [])
        self.last_id = str(state["last_id"])
        self.consumed = int(state["consumed"])
        self._consumed_published = None  # a crashed trainer may have sent a later count: send this one
        self._recent = OrderedDict((str(i), None) for i in state.get("recent_ids", []))
        self.counters = {str(k): int(v) for k, v in state.get("counters", {}).items()}
        epoch = state.get("epoch")  # absent from checkpoints of earlier versions: adopt what Redis holds
        self.epoch = None if epoch is None else str(epoch).encode()

    async def close(self) -> None:
        await self._drop_read_ahead()
        await self.stream.close()

    async def on_checkpoint_saved(self, state: dict[str, Any]) -> None:
        """A checkpoint holding ``state`` is on disk: its cursor entry and all before it can go."""
        if state["last_id"] != START:
            await self.stream.trim_before(_next_id(state["last_id"]))


def _next_id(entry_id: str) -> str:
    """The smallest stream id after ``entry_id`` (``ms-seq`` -> ``ms-(seq+1)``)."""
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"
