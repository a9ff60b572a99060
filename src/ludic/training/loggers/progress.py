"""What a person watches while an example trains: one short line per step, a before/after at the end.

``PrintLogger`` prints every stat (a step can carry 40 of them); ``ProgressLogger`` prints a few chosen
ones (``step 3/50  reward 0.250  loss -0.012  0.4 s``) and ``progress_and_metrics`` tees it with a
``JsonlLogger`` so every stat still lands in a metrics file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ludic.training.loggers.base import JsonlLogger, TeeLogger
from ludic.training.loggers.prefix import as_number, finite_float, prefix_key, to_float
from ludic.training.loggers.run_clock import RunClock

DEFAULT_KEYS: dict[str, str] = {
    "reward": "train/avg_total_reward",
    "loss": "train/loss",
    "eval": "eval/avg_total_reward",
}
"""Label -> stat key shown by default; a key missing from a step's stats is left out of its line."""

STEP_SECONDS_KEY = "perf/step_seconds"


class ProgressLogger:
    """One short line per logged step: ``[prefix] step 3/50  reward 0.250  loss -0.0123  0.4 s``.

    keys: label -> stat key (auto-prefixed, so ``"loss"`` means ``train/loss``), in the order shown.
    total_steps: shown as ``step 3/50`` when given. every: print every N-th step (and any step with an
    ``eval/`` stat). Seconds are the step's ``perf/step_seconds`` when present, else the wall time since
    the previous line. clock: also show the elapsed time and the ETA (``RunClock``).
    """

    def __init__(
        self,
        prefix: str = "",
        *,
        total_steps: int | None = None,
        keys: Mapping[str, str] | None = None,
        precision: int = 3,
        every: int = 1,
        stream: TextIO | None = None,
        clock: bool = False,
    ) -> None:
        if every < 1:
            raise ValueError(f"ProgressLogger.every must be >= 1, got {every}")
        self.prefix = prefix
        self.total_steps = total_steps
        self.keys = {label: prefix_key(key) for label, key in (keys or DEFAULT_KEYS).items()}
        self.precision = precision
        self.every = every
        self.stream = stream
        self._last = time.perf_counter()
        self.clock = RunClock(total_steps) if clock else None

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        stats = {prefix_key(k): to_float(v) for k, v in stats.items()}
        has_eval = any(k.startswith("eval/") for k in stats)
        now = time.perf_counter()
        seconds = stats.get(STEP_SECONDS_KEY, now - self._last)
        self._last = now
        if self.clock is not None:
            self.clock.tick(step)
        if step % self.every and not has_eval and step != self.total_steps:
            return
        print(self.format(step, stats, seconds), file=self.stream or sys.stdout, flush=True)

    def format(self, step: int, stats: Mapping[str, Any], seconds: float) -> str:
        """The line for one step (``stats`` already auto-prefixed)."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"{self.prefix} step {step}{total}".strip()]
        for label, key in self.keys.items():
            value = as_number(stats.get(key))
            if value is not None:
                parts.append(f"{label} {value:.{self.precision}f}")
        seconds = finite_float(seconds)
        if seconds is not None:
            parts.append(f"{seconds:.1f} s")
        if self.clock is not None:
            parts += [p for p in self.clock.parts() if not p.endswith("s/step")]
        return "  ".join(parts)

    def close(self) -> None:
        """Nothing to release."""


def progress_and_metrics(
    metrics_path: str | Path,
    prefix: str = "",
    *,
    total_steps: int | None = None,
    keys: Mapping[str, str] | None = None,
    every: int = 1,
    stream: TextIO | None = None,
) -> TeeLogger:
    """A short ``ProgressLogger`` line on screen, every stat in the JSONL at ``metrics_path``."""
    return TeeLogger(
        JsonlLogger(metrics_path),
        ProgressLogger(prefix, total_steps=total_steps, keys=keys, every=every, stream=stream),
    )


def before_after(label: str, before: float, after: float, *, prefix: str = "", precision: int = 3) -> str:
    """``[prefix] held-out reward 0.120 -> 0.650 (+0.530)``: the line an example ends with."""
    line = f"{label} {before:.{precision}f} -> {after:.{precision}f} ({after - before:+.{precision}f})"
    return f"{prefix} {line}".strip()
