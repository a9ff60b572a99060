"""Request functions from data: datasets, queues, and a curriculum that changes the mix over time.

A request function is what ``RolloutBatchSource`` calls once per macro-batch: a zero-argument
callable (sync or async) returning the next list of ``RolloutRequest``s. When the data is exhausted
it raises ``StopAsyncIteration``, which ends ``Trainer.train(num_steps=None)`` cleanly.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ludic.training.types import RolloutRequest

MakeRequest = Callable[[Any], RolloutRequest]
RequestFn = Callable[[], Any]


@dataclass(eq=False)
class DatasetRequests:
    """Batches of ``make_request(example)`` over a list, a ``datasets.Dataset`` or any iterable.

    Indexable data (``__len__`` + ``__getitem__``) is reshuffled every epoch with a seeded RNG;
    other iterables are consumed in order, once per epoch; a one-shot iterator (a generator, a
    streamed dataset) gives one epoch whatever ``epochs`` says. ``epochs=None`` cycles forever.
    The last batch of the data may be short; after it, calls raise StopAsyncIteration.
    """

    data: Sequence[Any] | Iterable[Any] = field(repr=False)
    make_request: MakeRequest
    _: KW_ONLY
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    epochs: int | None = None
    epoch: int = field(default=0, init=False)
    """Epochs completed so far."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size!r}")
        self._rng = random.Random(self.seed)
        self._examples = self._stream()

    def __call__(self) -> list[RolloutRequest]:
        examples = [ex for _, ex in zip(range(self.batch_size), self._examples)]
        if not examples:
            raise StopAsyncIteration
        return [self.make_request(ex) for ex in examples]

    def _stream(self) -> Iterator[Any]:
        while self.epochs is None or self.epoch < self.epochs:
            produced = False
            for example in self._one_epoch():
                produced = True
                yield example
            if not produced:
                if self.epoch > 0 and iter(self.data) is self.data:  # type: ignore[arg-type]
                    return  # a one-shot iterator: its single pass is over
                raise ValueError(f"DatasetRequests: the data is empty ({type(self.data).__name__})")
            self.epoch += 1

    def _one_epoch(self) -> Iterator[Any]:
        if hasattr(self.data, "__len__") and hasattr(self.data, "__getitem__"):
            order = list(range(len(self.data)))  # type: ignore[arg-type]
            if self.shuffle:
                self._rng.shuffle(order)
            for i in order:
                yield self.data[i]  # type: ignore[index]
        else:
            yield from self.data


requests_from_dataset = DatasetRequests
"""A request function over ``data`` (the function-style name of DatasetRequests)."""


def requests_from_queue(
    source: asyncio.Queue | queue.Queue, *, batch_size: int, timeout_s: float | None = None
) -> Callable[[], Any]:
    """An async request function that takes ``batch_size`` requests from a queue (blocking as needed).

    A ``None`` in the queue marks the end: the batch so far is returned, then StopAsyncIteration.
    ``timeout_s`` bounds the wait for each request: on a timeout a partial batch is returned (a
    trickling producer does not stall training) and an empty one raises TimeoutError.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    finished = False

    async def get() -> Any:
        if isinstance(source, asyncio.Queue):
            return await asyncio.wait_for(source.get(), timeout_s)
        try:
            return await asyncio.to_thread(source.get, True, timeout_s)
        except queue.Empty:
            raise TimeoutError from None

    async def next_requests() -> list[RolloutRequest]:
        nonlocal finished
        batch: list[RolloutRequest] = []
        while not finished and len(batch) < batch_size:
            try:
                item = await get()
            except TimeoutError:
                if batch:
                    return batch
                raise TimeoutError(f"requests_from_queue: no request arrived within {timeout_s} s") from None
            if item is None:
                finished = True
            else:
                batch.append(item)
        if not batch:
            raise StopAsyncIteration
        return batch

    return next_requests


Schedule = Callable[[int], Mapping[str, float]]
Stages = Sequence[tuple[int, Mapping[str, float]]]


class Curriculum:
    """Mixes several request functions with weights that change with the call count (≈ training step).

    ``schedule`` is either stages ``[(start_step, {name: weight}), ...]`` (see ``staged``) or a
    function ``step -> {name: weight}``. Each call picks ONE source for the whole macro-batch, drawn
    with probability proportional to its weight (seeded), so batches stay homogeneous and the mix
    holds over steps; requests are tagged with ``meta["curriculum_source"]``. A source that raises
    StopAsyncIteration is dropped and the draw repeats over the rest; when no source with a
    positive weight is left, the curriculum raises StopAsyncIteration.
    """

    def __init__(
        self, schedule: Stages | Schedule, sources: Mapping[str, RequestFn], *, seed: int = 0
    ) -> None:
        if isinstance(schedule, Mapping):
            raise TypeError("Curriculum(schedule, sources): pass the schedule first, then the sources")
        if not sources:
            raise ValueError("Curriculum needs at least one source")
        self.schedule: Schedule = schedule if callable(schedule) else self.staged(schedule)
        self.sources = dict(sources)
        self.step = 0
        self.exhausted: set[str] = set()
        self._rng = random.Random(seed)

    @staticmethod
    def staged(stages: Stages) -> Schedule:
        """A schedule from ``[(start_step, weights), ...]``: the last stage started applies."""
        ordered = sorted(stages, key=lambda s: s[0])
        if not ordered or ordered[0][0] != 0:
            raise ValueError(
                f"Curriculum stages need one starting at step 0, got starts {[s[0] for s in ordered]}"
            )

        def weights(step: int) -> Mapping[str, float]:
            return [w for start, w in ordered if start <= step][-1]

        return weights

    def weights(self) -> dict[str, float]:
        """This step's weights, validated (exhausted sources included)."""
        raw = dict(self.schedule(self.step))
        unknown = set(raw) - set(self.sources)
        if unknown:
            raise KeyError(
                f"curriculum weights name unknown sources {sorted(unknown)}; known: {sorted(self.sources)}"
            )
        if not raw or any(w < 0 for w in raw.values()) or sum(raw.values()) <= 0:
            raise ValueError(
                f"curriculum weights at step {self.step} must be >= 0 with a positive sum, got {raw}"
            )
        return raw

    async def __call__(self) -> list[RolloutRequest]:
        weights = self.weights()
        self.step += 1
        while True:
            live = {n: w for n, w in weights.items() if w > 0 and n not in self.exhausted}
            if not live:
                raise StopAsyncIteration
            name = self._rng.choices(list(live), weights=list(live.values()))[0]
            try:
                requests = self.sources[name]()
                if inspect.isawaitable(requests):
                    requests = await requests
            except StopAsyncIteration:
                self.exhausted.add(name)
                continue
            for request in requests:
                request.meta = {**request.meta, "curriculum_source": name}
            return list(requests)
