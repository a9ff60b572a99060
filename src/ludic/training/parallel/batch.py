"""Rollouts under ``torchrun``: rank 0 produces each macro-batch, every rank receives it.

Why rank 0 (not each rank its share of requests): the inference server is one shared service, and a
GRPO group must stay whole for credit assignment and ``algo.preprocess`` (group filters); one
producer keeps the batch exactly what a single process would have trained on, so multi-process
training stays equal to one process on the same global batch. The batch is broadcast to every rank
(JSON over the process group, never pickles); the Trainer then gives each rank its token-balanced
share (``distributed_step.DataParallelGroup.plan``). The same wrapper serves a pipeline batch source:
rank 0 reads the stream, the others never connect to it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.collectives import broadcast_json
from ludic.training.types import ActorTokenLogps, BatchSource, SampleAttachments, SAWBatch, SAWItem


def item_to_json(item: SAWItem) -> dict[str, Any]:
    actor = item.attachments.actor_logps
    return {
        "input_ids": list(item.input_ids),
        "attention_mask": list(item.attention_mask),
        "action_mask": list(item.action_mask),
        "weight": float(item.weight),
        "meta": item.meta,
        "actor_logps": None if actor is None else list(actor.token_logps),
        "token_weights": item.token_weights,
        "frozen_logps": {key: list(values) for key, values in item.attachments.frozen_logps.items()},
    }


def item_from_json(data: dict[str, Any]) -> SAWItem:
    logps = data["actor_logps"]
    return SAWItem(
        input_ids=data["input_ids"],
        attention_mask=data["attention_mask"],
        action_mask=data["action_mask"],
        weight=data["weight"],
        meta=data["meta"],
        attachments=SampleAttachments(
            actor_logps=None if logps is None else ActorTokenLogps(logps),
            frozen_logps=dict(data.get("frozen_logps") or {}),
        ),
        token_weights=data.get("token_weights"),
    )


class Rank0BatchSource:
    """A BatchSource that runs ``make_source()`` on rank 0 only and broadcasts each batch.

    ``make_source`` is a zero-argument factory, called lazily on rank 0 (other ranks build no
    engine, client or stream connection). When rank 0's source ends (``StopAsyncIteration``) or
    raises, every rank raises too, so no rank waits forever. Item meta must be JSON-serialisable.
    """

    def __init__(self, make_source: Callable[[], BatchSource]) -> None:
        if not callable(make_source):
            raise TypeError(f"Rank0BatchSource takes a zero-argument factory, got {make_source!r}")
        self.make_source = make_source
        self.inner: BatchSource | None = None

    def _rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    async def next_batch(self) -> SAWBatch:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return await self._source().next_batch()
        message: dict[str, Any] | None = None
        if self._rank() == 0:
            message = await self._produce()
        with named_collective("broadcast of the step's batch", peer_rank=0 if self._rank() != 0 else None):
            message = broadcast_json(message, src=0)
        if message["kind"] == "stop":
            raise StopAsyncIteration
        if message["kind"] == "error":
            raise RuntimeError(f"rank 0's batch source failed: {message['error']}")
        return SAWBatch(items=[item_from_json(d) for d in message["items"]], meta=message["meta"])

    def _source(self) -> BatchSource:
        if self.inner is None:
            self.inner = self.make_source()
        return self.inner

    async def _produce(self) -> dict[str, Any]:
        try:
            batch = await self._source().next_batch()
            message = {"kind": "batch", "items": [item_to_json(it) for it in batch.items], "meta": batch.meta}
            try:
                json.dumps(message)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"a batch crossing ranks must be JSON-serialisable (item/batch meta): {exc}") from exc
            return message
        except StopAsyncIteration:
            return {"kind": "stop"}
        except Exception as exc:  # tell the other ranks, then fail here with the real traceback
            broadcast_json({"kind": "error", "error": f"{type(exc).__name__}: {exc}"}, src=0)
            raise

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's source position (e.g. a stream cursor) for the checkpoint; ``{}`` elsewhere."""
        fn = getattr(self.inner, "state_dict", None)
        return dict(fn()) if callable(fn) else {}

    def load_state_dict(self, state: Any) -> None:
        if self._rank() == 0 and state:
            fn = getattr(self._source(), "load_state_dict", None)
            if callable(fn):
                fn(state)

    async def on_checkpoint_saved(self, state: Any) -> None:
        fn = getattr(self.inner, "on_checkpoint_saved", None)
        if callable(fn):
            result = fn(state)
            if inspect.isawaitable(result):
                await result
