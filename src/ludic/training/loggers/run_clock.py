"""What a person following a run wants besides the numbers: elapsed time, seconds per step, the ETA, the
latest held-out evaluation and where each step's time went (``time/*`` stats), for the dashboard and the
plain log alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ludic.training.loggers.prefix import as_number, finite_float, prefix_key

EVAL_KEY = "eval/avg_total_reward"
TIME_PREFIX = "time/"
"""``time/*`` stats: the parts of a step's wall time (``ludic.training._step_times``)."""


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class RunClock:
    """Elapsed wall time since ``start``, mean seconds per step over the steps logged since then, and the
    ETA to ``total_steps``; a resumed run counts from the first step it logs."""

    def __init__(
        self, total_steps: int | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total_steps = total_steps
        self._clock = clock
        self._t0 = clock()
        self._base: int | None = None
        self._last: tuple[int, float] | None = None

    def start(self) -> None:
        """Restart the clock (training begins now)."""
        self._t0, self._base, self._last = self._clock(), None, None

    def tick(self, step: int) -> None:
        if self._base is None:
            self._base = step - 1
        self._last = (step, self._clock())

    @property
    def elapsed(self) -> float:
        return self._clock() - self._t0

    @property
    def seconds_per_step(self) -> float | None:
        if self._last is None or self._base is None or self._last[0] <= self._base:
            return None
        return (self._last[1] - self._t0) / (self._last[0] - self._base)

    @property
    def eta(self) -> float | None:
        per_step = self.seconds_per_step
        if per_step is None or not self.total_steps or self._last is None:
            return None
        return per_step * max(self.total_steps - self._last[0], 0)

    def parts(self) -> list[str]:
        """``["elapsed 1m02s", "12.3 s/step", "ETA 9m50s"]`` (what is known so far)."""
        out = [f"elapsed {fmt_duration(self.elapsed)}"]
        per_step = self.seconds_per_step
        if per_step is not None:
            out.append(f"{per_step:.2f} s/step" if per_step < 10 else f"{per_step:.1f} s/step")
        eta = self.eta
        if eta is not None:
            out.append(f"ETA {fmt_duration(eta)}")
        return out


class LatestEval:
    """The latest held-out ``eval/avg_total_reward`` and its step: from the step stats, or told directly
    (the evaluations before and after the SFT warm start happen outside the training steps)."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.value: float | None = None

    def update(self, step: int, stats: Mapping[str, Any]) -> None:
        for key, value in stats.items():
            value = finite_float(value)
            if prefix_key(key) == EVAL_KEY and value is not None:
                self.step, self.value = step, value

    def text(self) -> str | None:
        """``held-out 0.250 (step 10)``, or None before any evaluation."""
        if self.value is None:
            return None
        return f"held-out {self.value:.3f} (step {self.step})"


def time_split(stats: Mapping[str, Any]) -> str | None:
    """``time: generate 0.81s, train 0.30s, ...``: every ``time/*`` stat present, in the order given."""
    parts = []
    for key, value in stats.items():
        full, value = str(key).removeprefix("perf/"), as_number(value)
        if not full.startswith(TIME_PREFIX) or value is None:
            continue
        name = full[len(TIME_PREFIX) :]
        if name.endswith("_seconds"):
            parts.append(f"{name.removesuffix('_seconds')} {value:.2f}s")
        else:
            parts.append(f"{name} {value:.3g}")
    return "time: " + ", ".join(parts) if parts else None
