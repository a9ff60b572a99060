"""Run loggers of ``ludic train`` and ``ludic quickstart``: metrics JSONL plus a live dashboard with
reward AND loss sparklines (or a plain line per step when stdout is not a terminal).

Both show what a person following the run asks for: elapsed time, seconds per step and the ETA
(``RunClock``), the latest held-out evaluation with its step (also the ones before training, told
through ``show_eval``), and every ``time/*`` stat (where the step's time went).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ludic.training.loggers import JsonlLogger, RichLiveLogger, TeeLogger, prefix_key, sparkline
from ludic.training.loggers.completions import CompletionSample, CompletionsLogger, plain_table, short
from ludic.training.loggers.prefix import as_number
from ludic.training.loggers.run_clock import LatestEval, RunClock, time_split

REWARD_KEY = "train/avg_total_reward"
LOSS_KEY = "train/loss"
EVAL_KEY = "eval/avg_total_reward"
PLAIN_LINES = 100
"""The plain log prints about this many step lines over a run (every step of a run this long or shorter)."""


class RewardLossDashboard(RichLiveLogger):
    """RichLiveLogger (reward sparkline) with a loss sparkline, the run's clock and latest held-out
    evaluation in the progress line, and every ``perf/`` and ``time/`` stat in its columns."""

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
        self.clock = RunClock(total_steps)
        self.evals = LatestEval()
        self.completions: tuple[int, Sequence[CompletionSample]] | None = None

    def __enter__(self) -> RewardLossDashboard:
        self.clock.start()
        super().__enter__()
        return self

    def show_eval(self, step: int, stats: Mapping[str, Any]) -> None:
        """A held-out evaluation outside the training steps (before training, after the SFT)."""
        self.evals.update(step, stats)
        if self.evals.value is not None:
            self._latest[EVAL_KEY] = self.evals.value

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        self.clock.tick(step)
        self.evals.update(step, stats)
        for key, value in stats.items():
            number = as_number(value)  # a tensor or numpy loss too; NaN is kept (a gap in the sparkline)
            if prefix_key(key) == LOSS_KEY and number is not None:
                self._loss_history.append(number)
        super().log(step, stats)

    def log_completions(self, step: int, samples: Sequence[CompletionSample]) -> None:
        """The latest table of sampled completions, drawn under the sparklines until the next one."""
        self.completions = (step, samples)
        if self._live is not None:
            self._live.update(self.render())

    def _shown(self) -> dict[str, Any]:
        shown = super()._shown()
        extra = {k: v for k, v in self._latest.items() if k.split("/", 1)[0] in ("perf", "time")}
        return {**shown, **extra}

    def _progress(self) -> str:
        held_out = self.evals.text()
        return "  ".join([super()._progress(), *self.clock.parts(), *([held_out] if held_out else [])])

    def render(self) -> Group:
        window = list(self._loss_history)[-self.spark_window :]
        last = f"{window[-1]:.3f}" if window else "-"
        loss_panel = Panel(Text(f"{sparkline(window)}  {last}"), title=LOSS_KEY)
        parts = [*super().render().renderables, loss_panel]
        if self.completions is not None:
            step, samples = self.completions
            table = Table(title=f"completions at step {step}", expand=True)
            for column, ratio in (("reward", 1), ("prompt", 4), ("reply", 4)):
                table.add_column(column, ratio=ratio, overflow="fold")
            for s in samples:
                reward = "-" if s.reward is None else f"{s.reward:.3f}"
                table.add_row(reward, short(s.prompt, 200), short(s.reply, 200))
            parts.append(table)
        return Group(*parts)


class EveryNPrinter:
    """The plain log (stdout not a terminal, or ``[logging] rich = false``): one line every ``every`` steps
    and on every step with an evaluation, flushed as it is printed::

        [ludic] step 3/50 | train/avg_total_reward=0.250 | train/loss=0.000 | held-out 0.125 (step 0) |
        elapsed 4s | 1.31 s/step | ETA 1m02s | time: generate 0.81s, train 0.30s
    """

    def __init__(self, every: int = 10, *, prefix: str = "[ludic]", total_steps: int | None = None,
                 precision: int = 3, stream: Any = None) -> None:  # fmt: skip
        if every < 1:  # else every step's line fails on ``step % 0``
            raise ValueError(f"EveryNPrinter.every must be >= 1, got {every}")
        self.every = every
        self.prefix = prefix
        self.total_steps = total_steps
        self.precision = precision
        self.stream = stream
        self.clock = RunClock(total_steps)
        self.evals = LatestEval()

    def __enter__(self) -> EveryNPrinter:
        self.clock.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to release."""

    def show_eval(self, step: int, stats: Mapping[str, Any]) -> None:
        """A held-out evaluation outside the training steps: shown on the next line printed."""
        self.evals.update(step, stats)

    def log_completions(self, step: int, samples: Sequence[CompletionSample]) -> None:
        """The table of sampled completions, printed and flushed (``reward | prompt | reply`` lines)."""
        print(plain_table(step, samples, prefix=self.prefix), file=self.stream or sys.stdout, flush=True)

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        self.clock.tick(step)
        self.evals.update(step, stats)
        has_eval = any(prefix_key(k) == EVAL_KEY for k in stats)
        if step % self.every == 0 or has_eval or step == self.total_steps:
            print(self.format(step, stats, has_eval), file=self.stream or sys.stdout, flush=True)

    def format(self, step: int, stats: Mapping[str, Any], has_eval: bool = False) -> str:
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"{self.prefix} step {step}{total}".strip()]
        values = {prefix_key(k): as_number(v) for k, v in stats.items()}
        for key in (REWARD_KEY, LOSS_KEY, EVAL_KEY):
            value = values.get(key)
            if value is not None:  # a NaN loss is shown as nan: it is what the reader needs to see
                parts.append(f"{key}={value:.{self.precision}f}")
        held_out = self.evals.text()
        if held_out and not has_eval:
            parts.append(held_out)
        parts += self.clock.parts()
        split = time_split(stats)
        if split:
            parts.append(split)
        return " | ".join(parts)


def plain_every(total_steps: int) -> int:
    """Print every N-th step so that a run prints about :data:`PLAIN_LINES` lines."""
    return max(1, math.ceil(total_steps / PLAIN_LINES))


def make_train_logger(
    jsonl_path: Path, *, total_steps: int, live: bool, prefix: str = "[ludic]", extra: Sequence[Any] = (),
    completions: CompletionsLogger | None = None,
) -> TeeLogger:
    """JSONL of every step's stats, plus the live dashboard (``live`` and stdout a terminal) or the plain log,
    and the ``extra`` sinks (W&B, TensorBoard); ``completions``, when given, shows its tables on all of them."""
    jsonl_path.parent.mkdir(parents=True, exist_ok=True)
    screen: Any
    if live and sys.stdout.isatty():
        screen = RewardLossDashboard(total_steps=total_steps)
    else:  # piped to a file: a line per step as it happens, not a redrawn panel that appears at the end
        screen = EveryNPrinter(plain_every(total_steps), prefix=prefix, total_steps=total_steps)
    tee = TeeLogger(JsonlLogger(jsonl_path), screen, *extra)
    if completions is not None:
        completions.sinks = tee
        tee.loggers.append(completions)  # last: the step's line is printed before its table
    return tee
