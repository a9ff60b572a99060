"""Weights & Biases sink; wandb is imported only when this logger is built (``pip install 'ludic[wandb]'``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic.training.loggers.prefix import prefix_stats, to_float


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "WandbLogger needs the wandb package: pip install 'ludic[wandb]' (or pip install wandb)"
        ) from exc
    return wandb


class WandbLogger:
    """Log auto-prefixed stats to a wandb run (a new one, or the active one when ``wandb.run`` is set).

    ``init_kwargs`` go straight to ``wandb.init`` (e.g. ``{"mode": "offline", "dir": ...}``).
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        wandb = _import_wandb()
        self._wandb = wandb
        self._owns_run = wandb.run is None
        if self._owns_run:
            kwargs: dict[str, Any] = {"project": project, "name": name, "group": group}
            if tags is not None:
                kwargs["tags"] = list(tags)
            if config is not None:
                kwargs["config"] = dict(config)
            kwargs.update(init_kwargs or {})
            self.run = wandb.init(**{k: v for k, v in kwargs.items() if v is not None})
        else:
            self.run = wandb.run
            if config:
                self.run.config.update(dict(config), allow_val_change=True)

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        self.run.log({k: to_float(v) for k, v in prefix_stats(stats).items()}, step=step)

    def log_completions(self, step: int, samples: Sequence[Any]) -> None:
        """Sampled completions as a ``wandb.Table`` under ``completions`` (step, prompt, reply, reward)."""
        rows = [[s.step, s.prompt, s.reply, s.reward] for s in samples]
        table = self._wandb.Table(columns=["step", "prompt", "reply", "reward"], data=rows)
        self.run.log({"completions": table}, step=step)

    def close(self) -> None:
        """Finish the run if this logger started it."""
        if self._owns_run and self.run is not None:
            self.run.finish()
            self.run = None

    def __enter__(self) -> WandbLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
