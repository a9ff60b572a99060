"""Where a step's wall time went, as ``time/*`` stats that add up to ``time/step_seconds``.

The Trainer times its own parts (preprocessing, forward-backward, optimizer, publish, evaluation,
checkpoint). What happened inside ``next_batch`` it cannot see, so a batch source may report it in the
batch's meta under ``time/...`` keys (``RolloutBatchSource``: ``time/generate_seconds``, the episodes
played; ``time/credit_seconds``, credit and items): those are copied as they are, and the rest of
``next_batch`` is ``time/wait_seconds`` (waiting for data: a pipeline's queue, a slow source). A source
reports only time spent inside its ``next_batch`` call, so the parts never count the same second twice.
Preprocessing steps may do the same (``FrozenModelScorer``: ``time/ref_logps_seconds``): their parts are
taken out of ``time/preprocess_seconds``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from time import perf_counter
from typing import Any

PREFIX = "time/"


class StepClock:
    """Seconds per named part of one step (``with clock.part("optimizer"): ...``)."""

    def __init__(self) -> None:
        self.start = perf_counter()
        self.parts: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        t0 = perf_counter()
        try:
            yield
        finally:
            self.add(name, perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds

    def source_parts(self, meta: Mapping[str, Any], next_batch_seconds: float) -> None:
        """The batch source's own ``time/`` parts, and the rest of ``next_batch`` as waiting."""
        reported = 0.0
        for key, value in meta.items():
            if key.startswith(PREFIX) and key.endswith("_seconds") and isinstance(value, (int, float)):
                name = key[len(PREFIX) : -len("_seconds")]
                self.add(name, float(value))
                reported += float(value)
        self.add("wait", max(next_batch_seconds - reported, 0.0))

    def nested_parts(self, meta: Mapping[str, Any], within: str) -> None:
        """``time/`` parts a step of ours reported in ``meta`` (preprocessing: ``time/ref_logps_seconds``
        from a reference scorer), taken out of ``within`` so no second counts twice."""
        for key, value in meta.items():
            if key.startswith(PREFIX) and key.endswith("_seconds") and isinstance(value, (int, float)):
                seconds = min(float(value), self.parts.get(within, 0.0))
                self.add(key[len(PREFIX) : -len("_seconds")], seconds)
                self.parts[within] = self.parts.get(within, 0.0) - seconds

    def stats(self) -> dict[str, float]:
        """``time/<part>_seconds`` for every part, and ``time/step_seconds`` since the clock started."""
        out = {f"{PREFIX}{name}_seconds": seconds for name, seconds in self.parts.items()}
        out[f"{PREFIX}step_seconds"] = perf_counter() - self.start
        return out


def without_times(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The batch meta less its ``time/`` keys (those are step times, not batch stats)."""
    return {k: v for k, v in meta.items() if not k.startswith(PREFIX)}
