"""The loggers ``[logging]`` asks for beyond metrics.jsonl and the screen: W&B (``wandb = {...}``) and
TensorBoard (``tensorboard = true``). :func:`logger_errors` is the dry run's check of them;
:func:`library_progress_bars` quiets the model libraries' bars unless ``progress_bars = true``."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ludic.config import RunConfig

TENSORBOARD_DIR = "tensorboard"
"""TensorBoard's event files go to ``<logging.output_dir>/tensorboard``."""


def config_loggers(cfg: RunConfig) -> list[Any]:
    """The sinks ``[logging]`` names, each opened now (a wandb run is initialised)."""
    from ludic.training.loggers import TensorBoardLogger, WandbLogger

    sinks: list[Any] = []
    if cfg.logging.tensorboard:
        sinks.append(TensorBoardLogger(Path(cfg.logging.output_dir) / TENSORBOARD_DIR))
    if cfg.logging.wandb is not None:
        sinks.append(WandbLogger(config=cfg.model_dump(mode="json"), init_kwargs=cfg.logging.wandb))
    return sinks


def completions_logger(cfg: RunConfig, trainer: Any, client: Any) -> Any:
    """``[logging].completions_every``: the trainer's batch source tapped (``BatchTap``) and a
    ``CompletionsLogger`` decoding its samples with the run's tokenizer; None when 0."""
    from ludic.cli.runtime import load_tokenizer
    from ludic.training.loggers.completions import COMPLETIONS_FILE, BatchTap, CompletionsLogger

    if not cfg.logging.completions_every:
        return None
    tokenizer = getattr(client, "tokenizer", None) or load_tokenizer(cfg)
    trainer.batch_source = tap = BatchTap(trainer.batch_source)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return CompletionsLogger(tap, decode, every=cfg.logging.completions_every, count=cfg.logging.completions_count,
                             path=Path(cfg.logging.output_dir) / COMPLETIONS_FILE)  # fmt: skip


def logger_errors(cfg: RunConfig) -> list[str]:
    """Each logger's package imports, and ``wandb = {...}`` holds only keywords ``wandb.init`` takes."""
    errors = []
    if cfg.logging.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as exc:
            errors.append(f"[logging].tensorboard: needs the tensorboard package (pip install "
                          f"'ludic[tensorboard]'): {exc}")  # fmt: skip
    if cfg.logging.wandb is not None:
        try:
            import wandb
        except ImportError as exc:
            return [*errors, f"[logging].wandb: needs the wandb package (pip install 'ludic[wandb]'): {exc}"]
        known = list(inspect.signature(wandb.init).parameters)
        unknown = sorted(set(cfg.logging.wandb) - set(known))
        if unknown:
            errors.append(f"[logging].wandb: {unknown} are not wandb.init keywords (it takes: {', '.join(known)})")
    return errors


def library_progress_bars(cfg: RunConfig) -> None:
    """transformers' and huggingface_hub's tqdm bars ("Loading weights", "Writing model shards") on or off
    as ``[logging].progress_bars`` says (process-wide: the run owns the process)."""
    import huggingface_hub.utils as hub
    import transformers.utils.logging as hf_logging

    if cfg.logging.progress_bars:
        hf_logging.enable_progress_bar()
        hub.enable_progress_bars()
    else:
        hf_logging.disable_progress_bar()
        hub.disable_progress_bars()
