"""``[logging]``: where a run writes and what it shows (a table of the run config, ``ludic.config.schema``)."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from ludic.config.section_base import Section, _at_least


class LoggingSection(Section):
    output_dir: str = "runs/ludic"
    """Where metrics.jsonl, the plot, eval results and checkpoints go."""
    rich: bool = True
    """Live terminal dashboard when stdout is a terminal (otherwise, or false: a plain line per step)."""
    plot: bool = True
    """Write the reward/loss PNG at the end."""
    wandb: dict[str, Any] | None = None
    """Log every step to Weights & Biases: keyword arguments of ``wandb.init`` (``project``, ``name``, ``group``,
    ``tags``, ``entity``, ``mode = "offline"``, ``dir``, ...; ``{}`` for wandb's defaults); the run config is
    the wandb run's ``config``. Needs ``pip install 'ludic[wandb]'``."""
    tensorboard: bool = False
    """Write every step's stats as TensorBoard scalars to ``<output_dir>/tensorboard``
    (``pip install 'ludic[tensorboard]'``)."""
    progress_bars: bool = False
    """Show the model libraries' loading and saving bars (transformers, huggingface_hub) on stderr."""
    completions_every: int = 10
    """Every N steps, a table of sampled completions of the step's batch (prompt, reply, reward; one per prompt
    first) in the plain log and the dashboard, in ``<output_dir>/completions.jsonl``, as a W&B table and as
    TensorBoard text (0: never)."""
    completions_count: int = 4
    """Completions in each of those tables."""

    @model_validator(mode="after")
    def _check(self) -> LoggingSection:
        _at_least(self, 0, "completions_every")
        _at_least(self, 1, "completions_count")
        return self
