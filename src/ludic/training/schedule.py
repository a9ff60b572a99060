"""Learning-rate schedules named by ``TrainerConfig.lr_schedule``: warm-up, then constant/linear/cosine.

The Trainer builds one of these when it is not handed an ``lr_scheduler``; it steps once per
optimizer step, so ``lr_at(step)`` is the learning rate used by optimizer step ``step + 1``.

Why a warm-up on small models: Adam's first updates move every weight by about ``lr`` whatever the
gradient's size, which on a ~1M-parameter model can push every reply past ``max_tokens`` (all-zero
reward, no signal left). Why a decay: late in training a constant rate makes the policy drift off
a task it has solved.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(name: str, *, warmup_steps: int, total_steps: int | None) -> Callable[[int], float]:
    """Multiplier of the base lr at (0-based) optimizer step ``step``.

    warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``; then
    constant: 1; linear: ``(total - step) / (total - warmup)``, reaching 0 at ``total_steps``;
    cosine: ``0.5 * (1 + cos(pi * progress))`` with progress = ``(step - warmup) / (total - warmup)``.
    Past ``total_steps`` a decaying schedule stays at 0.
    """
    if name not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {name!r}")
    if name != "constant" and total_steps is None:
        raise ValueError(
            f"lr_schedule={name!r} decays to 0 at total_steps; set TrainerConfig.total_steps "
            "(usually the num_steps you pass to train)"
        )

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if name == "constant":
            return 1.0
        assert total_steps is not None
        progress = min(1.0, (step - warmup_steps) / max(total_steps - warmup_steps, 1))
        if name == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, name: str, *, warmup_steps: int, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR | None:
    """A ``LambdaLR`` over ``optimizer``, or None for a constant rate with no warm-up."""
    if name == "constant" and warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(name, warmup_steps=warmup_steps, total_steps=total_steps)
    )
