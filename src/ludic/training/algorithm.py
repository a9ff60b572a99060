"""An RL algorithm is a credit assigner plus a loss (plus optional batch preprocessing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ludic.training.types import CreditAssigner, SAWBatch

PreprocessFn = Callable[[SAWBatch], SAWBatch]
"""Validates/filters a macro-batch before it is split and collated (applied by the Trainer)."""


@dataclass
class RLAlgorithm:
    """Bundle of how rewards become weights (``credit_assigner``) and weights become gradients (``loss``)."""

    name: str
    credit_assigner: CreditAssigner
    loss: Any  # ludic.training.loss.Loss
    preprocess: PreprocessFn | None = None
