"""The quickstart's SFT warm start: a few steps on synthetic demonstrations before RL.

The SFT pass itself is ``ludic train``'s (``ludic.cli.warm_start.sft_in_place``): the run's policy is
trained in place with the run's trainer settings at ``--sft-lr`` and a constant schedule, published
to the run's engine, and the engine's policy version is restarted at 0 so that RL versions count RL
steps. Only the demonstrations (the letter task's, from seeds of their own) are the quickstart's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ludic.cli.warm_start import reset_policy_version, sft_in_place
from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.demonstrations import demonstration_items

__all__ = ["SFT_SEED_OFFSET", "reset_policy_version", "save_warm_model", "warm_start"]

SFT_SEED_OFFSET = 500_000
"""Demonstration env seeds start here: disjoint from training (below) and held-out (1e6+) seeds."""


async def warm_start(cfg: QuickstartConfig, run: Any) -> None:
    """SFT on ``cfg.sft_steps`` batches of demonstrations, in order; ``run`` is a ``TrainRun``."""
    seeds = range(SFT_SEED_OFFSET, SFT_SEED_OFFSET + cfg.sft_steps * cfg.sft_batch_size)
    items = demonstration_items(run.client.tokenizer, seeds=seeds, count=cfg.count, letters=cfg.letters)
    await sft_in_place(run, items, steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr)


def save_warm_model(run: Any, out_dir: Path) -> Path:
    """The warm-started policy as a ``from_pretrained`` folder (what ``run_config.yaml`` starts from)."""
    run.trainer.model.save_pretrained(out_dir)
    run.client.tokenizer.save_pretrained(out_dir)
    return out_dir
