"""The quickstart's SFT warm start: a few steps on synthetic demonstrations before RL.

It trains the run's policy in place (the model ``build_train_run`` loaded) with the run's trainer
settings at ``--sft-lr`` and a constant schedule, publishes to the run's engine, then resets the
engine's policy version to 0 so that RL versions count RL steps, as in a ``ludic train`` run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.demonstrations import demonstration_items

SFT_SEED_OFFSET = 500_000
"""Demonstration env seeds start here: disjoint from training (below) and held-out (1e6+) seeds."""


async def warm_start(cfg: QuickstartConfig, run: Any) -> None:
    """SFT on ``cfg.sft_steps`` batches of demonstrations; ``run`` is a ``ludic.cli.run_config.TrainRun``."""
    from ludic.distributed import ClientPublisher
    from ludic.training.batching import OfflineBatchSource
    from ludic.training.presets import make_sft
    from ludic.training.trainer import Trainer

    seeds = range(SFT_SEED_OFFSET, SFT_SEED_OFFSET + cfg.sft_steps * cfg.sft_batch_size)
    items = demonstration_items(run.client.tokenizer, seeds=seeds, count=cfg.count, letters=cfg.letters)
    source = OfflineBatchSource(items, batch_size=cfg.sft_batch_size, shuffle=False)
    sft_cfg = dataclasses.replace(  # the run's trainer settings at the SFT learning rate, no schedule
        run.cfg.trainer, lr=cfg.sft_lr, learning_rate=None, eval_every_n_steps=None,
        lr_schedule="constant", warmup_steps=0, total_steps=None, step_in_thread=False,
    )  # fmt: skip
    trainer = Trainer(
        model=run.trainer.model,
        algo=make_sft(),
        batch_source=source,
        publisher=ClientPublisher(run.client),
        cfg=sft_cfg,
    )
    await trainer.train(cfg.sft_steps)
    reset_policy_version(run.client)


def reset_policy_version(client: Any) -> None:
    """The trainer publishes ``version=step``; the SFT publishes left the engine ahead of RL step 0,
    which would tag the first RL items as newer than the trainer (pipeline mode drops by that)."""
    client.restart_versions(0)


def save_warm_model(run: Any, out_dir: Path) -> Path:
    """The warm-started policy as a ``from_pretrained`` folder (what ``run_config.yaml`` starts from)."""
    run.trainer.model.save_pretrained(out_dir)
    run.client.tokenizer.save_pretrained(out_dir)
    return out_dir
