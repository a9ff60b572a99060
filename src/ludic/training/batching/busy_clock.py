"""How long the envs were busy during a batch, for the step's time split (``time/score_seconds``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any


class BusyClock:
    """Wall time during which at least one wrapped call is in flight (overlapping calls count once), so the
    envs' steps of concurrent episodes add up to seconds of the batch, never more."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._in_flight = 0
        self._since = 0.0

    def wrap(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            if self._in_flight == 0:
                self._since = perf_counter()
            self._in_flight += 1
            try:
                return await fn(*args, **kwargs)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.seconds += perf_counter() - self._since

        return timed
