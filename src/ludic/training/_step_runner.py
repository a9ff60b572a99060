"""Where the Trainer's step runs: its event loop for the sync wrappers, its worker thread for
``TrainerConfig.step_in_thread``. Kept apart so the Trainer's loop reads without either."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class StepRunner:
    """Runs the step's compute here or on one worker thread, and coroutines from sync code."""

    def __init__(self, *, in_thread: bool) -> None:
        self.in_thread = in_thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: ThreadPoolExecutor | None = None

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` here, or with ``in_thread`` on the one worker thread while the event loop serves
        others (actor tasks, the embedded engine). A cancelled step still finishes before the
        cancellation propagates, so the model, optimizer and step count stay consistent."""
        if not self.in_thread:
            return fn(*args)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-trainer")
        future = asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await future
            raise

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to its end on the runner's own loop (one loop for all calls: async sources keep state)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "train_sync/train_step_sync called inside an event loop; use `await trainer.train(...)`"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        """Close the loop and the worker thread. Tasks still pending on the loop (a batch source's
        read-ahead) are cancelled and run to their end first, as ``asyncio.run`` does, so their
        clean-up runs while the loop is still there."""
        if self._loop is not None and not self._loop.is_closed():
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
