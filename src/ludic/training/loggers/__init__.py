"""Training loggers: print, a short progress line, tee, JSON lines, a rich live dashboard, wandb and TensorBoard
(both imported on first use)."""

from ludic.training.loggers.base import JsonlLogger, PrintLogger, TeeLogger, TrainingLogger
from ludic.training.loggers.prefix import group_by_prefix, prefix_key, prefix_stats
from ludic.training.loggers.progress import ProgressLogger, before_after, progress_and_metrics
from ludic.training.loggers.rich_live import RichLiveLogger, sparkline
from ludic.training.loggers.tensorboard_logger import TensorBoardLogger
from ludic.training.loggers.wandb_logger import WandbLogger

__all__ = [
    "JsonlLogger",
    "PrintLogger",
    "ProgressLogger",
    "RichLiveLogger",
    "TeeLogger",
    "TensorBoardLogger",
    "TrainingLogger",
    "WandbLogger",
    "before_after",
    "group_by_prefix",
    "prefix_key",
    "prefix_stats",
    "progress_and_metrics",
    "sparkline",
]
