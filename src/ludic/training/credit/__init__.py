"""Credit assignment: how rewards become one scalar weight per step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.credit.assigners import (
        ConstantCredit,
        EpisodicReturn,
        GroupNormalizedReturn,
        HybridNormalizedReturn,
        MonteCarloReturn,
        PerStepReward,
    )
    from ludic.training.credit.per_turn import PerTurnReturn

__all__ = [
    "ConstantCredit",
    "EpisodicReturn",
    "GroupNormalizedReturn",
    "HybridNormalizedReturn",
    "MonteCarloReturn",
    "PerStepReward",
    "PerTurnReturn",
]

__getattr__, __dir__ = lazy_exports(__name__)
