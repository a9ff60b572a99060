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

_EXPORTS = {
    "ConstantCredit": ("ludic.training.credit.assigners", "ConstantCredit"),
    "EpisodicReturn": ("ludic.training.credit.assigners", "EpisodicReturn"),
    "GroupNormalizedReturn": ("ludic.training.credit.assigners", "GroupNormalizedReturn"),
    "HybridNormalizedReturn": ("ludic.training.credit.assigners", "HybridNormalizedReturn"),
    "MonteCarloReturn": ("ludic.training.credit.assigners", "MonteCarloReturn"),
    "PerStepReward": ("ludic.training.credit.assigners", "PerStepReward"),
    "PerTurnReturn": ("ludic.training.credit.per_turn", "PerTurnReturn"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
