"""TensorBoard sink: each numeric stat as a scalar (``torch.utils.tensorboard``; ``pip install 'ludic[tensorboard]'``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic.training.loggers.prefix import finite_float, prefix_stats


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch.utils.tensorboard imports the tensorboard package
        raise ImportError(
            "TensorBoardLogger needs the tensorboard package: pip install 'ludic[tensorboard]' "
            "(or pip install tensorboard)"
        ) from exc
    return SummaryWriter


class TensorBoardLogger:
    """Write auto-prefixed stats (``train/loss``, ``eval/...``, ``perf/...``) as scalars under ``log_dir``
    (``tensorboard --logdir <log_dir>``); values that are not finite numbers are left out."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.writer: Any = _summary_writer()(log_dir=str(self.log_dir))

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        if self.writer is None:
            raise RuntimeError(f"TensorBoardLogger({self.log_dir}) is closed")
        for key, value in prefix_stats(stats).items():
            number = finite_float(value)  # an int too big for a float is left out, not the step's other stats
            if number is not None:
                self.writer.add_scalar(key, number, global_step=step)
        self.writer.flush()

    def log_completions(self, step: int, samples: Sequence[Any]) -> None:
        """Sampled completions as a markdown table under the text tag ``completions``."""
        from ludic.training.loggers.completions import markdown_table

        if self.writer is None:
            raise RuntimeError(f"TensorBoardLogger({self.log_dir}) is closed")
        self.writer.add_text("completions", markdown_table(samples), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
