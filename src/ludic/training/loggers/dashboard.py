"""Run loggers of ``ludic train`` and ``ludic quickstart``: metrics JSONL plus a live dashboard with
reward AND loss sparklines (or a line every N steps when not interactive)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from ludic.training.loggers import JsonlLogger, PrintLogger, RichLiveLogger, TeeLogger, prefix_key, sparkline

REWARD_KEY = "train/avg_total_reward"
LOSS_KEY = "train/loss"
EVAL_KEY = "eval/avg_total_reward"


class RewardLossDashboard(RichLiveLogger):
    """RichLiveLogger (reward sparkline) with a second sparkline panel for the loss."""

    def __init__(self, *, total_steps: int, history: int = 200, spark_window: int = 60) -> None:
        super().__init__(
            keys=[REWARD_KEY, LOSS_KEY, EVAL_KEY, "train/avg_completion_length", "train/num_samples"],
            spark_key=REWARD_KEY,
            history=history,
            spark_window=spark_window,
            precision=3,
            total_steps=total_steps,
        )
        self._loss_history: deque[float] = deque(maxlen=history)

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        for key, value in stats.items():
            if prefix_key(key) == LOSS_KEY and isinstance(value, (int, float)):
                self._loss_history.append(float(value))
        super().log(step, stats)

    def render(self) -> Group:
        window = list(self._loss_history)[-self.spark_window :]
        last = f"{window[-1]:.3f}" if window else "-"
        loss_panel = Panel(Text(f"{sparkline(window)}  {last}"), title=LOSS_KEY)
        return Group(*super().render().renderables, loss_panel)


class EveryNPrinter:
    """Non-interactive fallback: one line every ``every`` steps."""

    def __init__(self, every: int = 10, *, prefix: str = "[ludic]") -> None:
        self.every = every
        self._printer = PrintLogger(prefix=prefix, precision=3)

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        if step % self.every == 0 or any(prefix_key(k) == EVAL_KEY for k in stats):
            shown = {k: v for k, v in stats.items() if prefix_key(k) in (REWARD_KEY, LOSS_KEY, EVAL_KEY)}
            self._printer.log(step, shown)


def make_train_logger(
    jsonl_path: Path, *, total_steps: int, live: bool, prefix: str = "[ludic]", extra: Sequence[Any] = ()
) -> TeeLogger:
    """JSONL of every step's stats, plus the live dashboard (or a ``prefix`` line every 10 steps) and the
    ``extra`` sinks (W&B, TensorBoard)."""
    jsonl_path.parent.mkdir(parents=True, exist_ok=True)
    screen: Any = RewardLossDashboard(total_steps=total_steps) if live else EveryNPrinter(prefix=prefix)
    return TeeLogger(JsonlLogger(jsonl_path), screen, *extra)
