"""The NaN/inf check of a weight update's tensors: begun as each call arrives, finished by whoever waits.

A background thread (one OpenMP thread: it runs beside the next call's transfer) checks the tensors
queued so far whenever ``start_background`` is called: on each broadcast call's arrival, or (shared
memory) when the next call is reserved, since the trainer is then writing it (not on the call's own
arrival: the check would then compete with the reply to that call). ``first_bad`` has the background
thread and the calling thread (one OpenMP thread each) share whatever is still queued, so the tail runs
on two cores, and returns once both are done.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ludic.inference.weight_sync.weights import SMALL_ELEMENTS, first_non_finite


class FiniteCheck:
    """One update's check; ``executor`` runs the background part (a one-worker pool shared across updates)."""

    def __init__(self, executor: ThreadPoolExecutor, dtypes: Mapping[str, torch.dtype] | None = None) -> None:
        """``dtypes``: the model's dtype by name; a tensor is checked as it will be stored (after the cast)."""
        self._executor = executor
        self._dtypes = dtypes
        self._queue: deque[tuple[int, str, torch.Tensor]] = deque()
        self._lock = threading.Lock()
        self._added = 0
        self._bad: list[tuple[int, str]] = []
        self._background: list[Future[None]] = []
        self.seconds = 0.0  # spent checking, on either thread

    def add(self, tensors: dict[str, torch.Tensor], *, background: bool = True) -> None:
        """Queue ``tensors``; ``background``: start checking the queue on the background thread now."""
        with self._lock:
            self._queue.extend((self._added + i, name, t) for i, (name, t) in enumerate(tensors.items()))
            self._added += len(tensors)
        if background:
            self.start_background()

    def start_background(self) -> None:
        with self._lock:
            if not self._queue:
                return
        self._background.append(self._executor.submit(self._drain))

    def first_bad(self) -> str | None:
        """The first tensor (in arrival order) holding NaN or inf, or None, once every tensor is checked."""
        with self._lock:  # large tensors left: the background thread takes part of them, this thread the rest
            large = any(t.numel() > SMALL_ELEMENTS for _, _, t in self._queue)  # (small ones: one pass, here)
        if large:
            self.start_background()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # this thread's own OpenMP setting: two checks on two cores, not three threads
        try:
            self._drain()
        finally:
            torch.set_num_threads(threads)
        for done in self._background:
            done.result()
        return min(self._bad)[1] if self._bad else None

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                batch = self._take()
            t0 = time.perf_counter()
            bad = first_non_finite({name: tensor for _, name, tensor in batch.values()}, self._dtypes)
            with self._lock:
                self.seconds += time.perf_counter() - t0
                if bad is not None:
                    self._bad.append((batch[bad][0], bad))

    def _take(self) -> dict[str, tuple[int, str, torch.Tensor]]:
        """The next queued tensor, or the run of small ones in front (checked in one pass, ``first_non_finite``:
        an adapter's 112 small tensors one by one on two threads took 5x as long); the lock is held."""
        index, name, tensor = self._queue.popleft()
        batch = {name: (index, name, tensor)}
        while tensor.numel() <= SMALL_ELEMENTS and self._queue and self._queue[0][2].numel() <= SMALL_ELEMENTS:
            if self._queue[0][1] in batch:  # the same name sent twice: each one is checked
                break
            index, name, tensor = self._queue.popleft()
            batch[name] = (index, name, tensor)
        return batch
