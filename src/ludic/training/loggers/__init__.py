"""Training loggers: print, tee, JSON lines, a rich live dashboard and wandb (imported on first use)."""

from ludic.training.loggers.base import JsonlLogger, PrintLogger, TeeLogger, TrainingLogger
from ludic.training.loggers.prefix import group_by_prefix, prefix_key, prefix_stats
from ludic.training.loggers.rich_live import RichLiveLogger, sparkline
from ludic.training.loggers.wandb_logger import WandbLogger

__all__ = [
    "JsonlLogger",
    "PrintLogger",
    "RichLiveLogger",
    "TeeLogger",
    "TrainingLogger",
    "WandbLogger",
    "group_by_prefix",
    "prefix_key",
    "prefix_stats",
    "sparkline",
]
