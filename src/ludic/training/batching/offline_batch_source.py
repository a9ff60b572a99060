"""SFT and offline RL from SAW items in memory or JSONL files on disk (streamed, never fully loaded).

A JSONL line is either a SAW item (``saw_item_to_dict``) or a rollout (``rollout_to_dict``); rollouts
are turned into items with ``credit_assigner`` (default ``ConstantCredit(1.0)``, i.e. SFT).
Files are read line by line; ``shuffle`` uses a bounded buffer, so files larger than memory work.
A batch never holds one item twice: where the next epoch comes round to an item the batch already has, the
batch ends there (short) and that item opens the next one, so every item is still trained once an epoch.
Every line is checked as it is read (a JSON object, token ids ints in ``[0, vocab_size)``, or ``>= 0``
when ``vocab_size`` is not given); a bad line is a ValueError naming the file and line number.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path

from ludic.training.batching.jsonl import (
    check_token_ids,
    iter_jsonl_numbered,
    rollout_from_dict,
    saw_item_from_dict,
)
from ludic.training.batching.saw_builder import rollouts_to_saw_items
from ludic.training.types import CreditAssigner, SAWBatch, SAWItem

Keyed = tuple[Hashable, SAWItem]
"""An item with its place in the data (list index, or file, line and item of that line): the same in every epoch."""


class OfflineBatchSource:
    """Cycles over the data in batches of ``batch_size`` items (``epochs=None``: forever).

    ``vocab_size`` (the model's, when known) bounds the token ids; without it ids need only be ``>= 0``.
    """

    def __init__(
        self,
        data: Sequence[SAWItem] | str | Path | Sequence[str | Path],
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer: int = 10_000,
        credit_assigner: CreditAssigner | None = None,
        epochs: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.items: list[SAWItem] | None = None
        self.paths: list[Path] = []
        if isinstance(data, (str, Path)):
            self.paths = [Path(data)]
        elif data and all(isinstance(d, SAWItem) for d in data):
            self.items = list(data)  # type: ignore[arg-type]
        elif data and all(isinstance(d, (str, Path)) for d in data):
            self.paths = [Path(d) for d in data]  # type: ignore[union-attr]
        else:
            raise ValueError("OfflineBatchSource needs a non-empty list of SAWItems or JSONL path(s)")
        for path in self.paths:
            if not path.is_file():
                raise FileNotFoundError(f"OfflineBatchSource: no such file {path}")
        self.vocab_size = vocab_size
        for i, item in enumerate(self.items or []):
            check_token_ids(f"items[{i}].input_ids", item.input_ids, vocab_size)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.credit_assigner = credit_assigner
        self.epochs = epochs
        self._rng = random.Random(seed)
        self._stream = self._cycle()
        self._held: Keyed | None = None  # an item the last batch already had: it opens this one

    async def next_batch(self) -> SAWBatch:
        batch: list[SAWItem] = []
        keys: set[Hashable] = set()
        while len(batch) < self.batch_size:
            entry, self._held = self._held or next(self._stream, None), None
            if entry is None:
                break
            if entry[0] in keys:  # the next epoch reached an item this batch holds: never train it twice here
                self._held = entry
                break
            keys.add(entry[0])
            batch.append(entry[1])
        if not batch:
            raise StopAsyncIteration
        return SAWBatch(
            items=batch, meta={"target_rollouts": float(len({i.meta.get("rollout_id") for i in batch}))}
        )

    # ---- streaming ----------------------------------------------------------------------------
    def _cycle(self) -> Iterator[Keyed]:
        epoch = 0
        while self.epochs is None or epoch < self.epochs:
            produced = False
            for item in self._shuffled(self._one_epoch()):
                produced = True
                yield item
            if not produced:
                raise ValueError(f"OfflineBatchSource: no items in {self.paths or 'the given list'}")
            epoch += 1

    def _one_epoch(self) -> Iterator[Keyed]:
        if self.items is not None:
            yield from enumerate(self.items)
            return
        for file_index, path in enumerate(self.paths):
            for lineno, record in iter_jsonl_numbered(path):
                try:
                    items = self._items_from_record(record)
                except (KeyError, ValueError, TypeError) as exc:
                    kind = "rollout" if _is_rollout(record) else "SAW item"
                    raise ValueError(f"{path}:{lineno}: bad {kind} record: {exc}") from exc
                yield from (((file_index, lineno, k), item) for k, item in enumerate(items))

    def _items_from_record(self, record: dict) -> list[SAWItem]:
        if _is_rollout(record):
            rollout = rollout_from_dict(record)
            assigner = self.credit_assigner
            if assigner is None:
                from ludic.training.credit.assigners import ConstantCredit

                assigner = self.credit_assigner = ConstantCredit(1.0)
            items = rollouts_to_saw_items([rollout], assigner.compute([rollout]))
        else:
            items = [saw_item_from_dict(record)]
        for item in items:
            check_token_ids("input_ids", item.input_ids, self.vocab_size)
        return items

    def _shuffled(self, stream: Iterator[Keyed]) -> Iterator[Keyed]:
        if not self.shuffle:
            yield from stream
            return
        buffer: list[Keyed] = []
        for item in stream:
            buffer.append(item)
            if len(buffer) >= self.shuffle_buffer:
                yield buffer.pop(self._rng.randrange(len(buffer)))
        self._rng.shuffle(buffer)
        yield from buffer


def _is_rollout(record: dict) -> bool:
    return record.get("kind") == "rollout" or "steps" in record
