"""A frozen model's view of the batch: the scorer, KL to a reference model, on-policy distillation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.reference.distill import make_distill
    from ludic.training.reference.kl_penalty import RefModel, add_kl_penalty
    from ludic.training.reference.scoring import FrozenModelScorer

__all__ = [
    "FrozenModelScorer",
    "RefModel",
    "add_kl_penalty",
    "make_distill",
]

__getattr__, __dir__ = lazy_exports(__name__)
