"""A live terminal dashboard: train/eval/perf columns, a sparkline and step progress (guide §6)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ludic.training.loggers.prefix import GROUPS, as_number, group_by_prefix, prefix_key, to_float

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """Map values onto eight block characters, lowest to highest (flat series -> lowest block; a value that
    is not finite -> a space)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    return "".join(_BLOCKS[_level(v, lo, hi)] if math.isfinite(v) else " " for v in values)


def _level(v: float, lo: float, hi: float) -> int:
    """``v``'s block between ``lo`` and ``hi``; halved when ``hi - lo`` overflows (``1e308 - -1e308``)."""
    if hi == lo:
        return 0
    frac = (v - lo) / (hi - lo) if math.isfinite(hi - lo) else (v / 2 - lo / 2) / (hi / 2 - lo / 2)
    return round(frac * (len(_BLOCKS) - 1))


class RichLiveLogger:
    """Dashboard for local runs; use as a context manager (``with logger: trainer.train_sync(...)``).

    keys: stats to show (auto-prefixed, so "loss" means "train/loss"); None shows everything.
    spark_key: stat whose history is drawn as a sparkline.
    history: how many values of ``spark_key`` are kept; spark_window: how many are drawn.
    Outside a ``with`` block, each ``log`` prints the dashboard once (handy for non-interactive use).
    """

    def __init__(
        self,
        keys: Sequence[str] | None = None,
        spark_key: str | None = None,
        history: int = 100,
        spark_window: int = 50,
        precision: int = 4,
        *,
        total_steps: int | None = None,
        console: Console | None = None,
        refresh_per_second: float = 4.0,
    ) -> None:
        if history < 1 or spark_window < 1:
            raise ValueError(f"history and spark_window must be >= 1, got {history}, {spark_window}")
        self.keys = [prefix_key(k) for k in keys] if keys is not None else None
        self.spark_key = prefix_key(spark_key) if spark_key else None
        self.spark_window = spark_window
        self.precision = precision
        self.total_steps = total_steps
        self.console = console or Console()
        self._history: deque[float] = deque(maxlen=history)
        self._latest: dict[str, Any] = {}
        self._step = 0
        self._live: Live | None = None
        self._refresh = refresh_per_second

    def __enter__(self) -> RichLiveLogger:
        self._live = Live(self.render(), console=self.console, refresh_per_second=self._refresh)
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(None, None, None)
            self._live = None

    def close(self) -> None:
        self.__exit__(None, None, None)

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        self._step = step
        for key, value in stats.items():
            self._latest[prefix_key(key)] = to_float(value)
        if self.spark_key is not None:
            value = as_number(self._latest.get(self.spark_key))
            if value is not None and self.spark_key in {prefix_key(k) for k in stats}:
                self._history.append(value)
        if self._live is not None:
            self._live.update(self.render())
        else:
            self.console.print(self.render())

    def _shown(self) -> dict[str, Any]:
        if self.keys is None:
            return dict(self._latest)
        return {k: self._latest[k] for k in self.keys if k in self._latest}

    def _fmt(self, value: Any) -> str:
        return f"{value:.{self.precision}f}" if isinstance(value, float) else str(value)

    def render(self) -> Group:
        """Build the dashboard renderable: progress line, three stat columns, sparkline panel."""
        groups = group_by_prefix(self._shown())
        table = Table(expand=True)
        for group in GROUPS:
            table.add_column(group, ratio=1)
        columns = [[f"{k}: {self._fmt(v)}" for k, v in sorted(groups[g].items())] for g in GROUPS]
        for row in range(max((len(c) for c in columns), default=0)):
            table.add_row(*[c[row] if row < len(c) else "" for c in columns])
        parts: list[Any] = [Text(self._progress()), table]
        if self.spark_key is not None:
            window = list(self._history)[-self.spark_window :]
            last = self._fmt(window[-1]) if window else "-"
            parts.append(Panel(Text(f"{sparkline(window)}  {last}"), title=self.spark_key))
        return Group(*parts)

    def _progress(self) -> str:
        if not self.total_steps:
            return f"step {self._step}"
        frac = min(1.0, self._step / self.total_steps)
        filled = round(frac * 30)
        return f"step {self._step}/{self.total_steps} [{'#' * filled}{'.' * (30 - filled)}] {frac:.0%}"
