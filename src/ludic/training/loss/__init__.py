"""Losses: each ``compute(logits [B, T, V], batch) -> (loss, stats)``, a mean over sequences."""

from ludic.training.loss.base import (
    Loss,
    TokenLogpLoss,
    compute_logp_action,
    compute_token_logps,
    seq_reduce,
)
from ludic.training.loss.reinforce import ReinforceBaselineLoss, ReinforceLoss

__all__ = [
    "Loss",
    "ReinforceBaselineLoss",
    "ReinforceLoss",
    "TokenLogpLoss",
    "compute_logp_action",
    "compute_token_logps",
    "seq_reduce",
]
