"""Losses: each ``compute(logits [B, T, V], batch) -> (loss, stats)``, a mean over sequences.

One module per idea: ``base`` (the seam and the shared token log-probs), ``reinforce``, ``clipped``
(GRPO/GSPO), ``cispo``, ``kl``, ``sft``, ``composite``, ``mismatch`` (TIS/MIS and mismatch stats).
"""

from ludic.training.loss.base import (
    Loss,
    Stats,
    TokenLogpLoss,
    compute_logp_action,
    compute_token_logps,
    seq_reduce,
    token_mean_keys,
)
from ludic.training.loss.cispo import CISPOLoss
from ludic.training.loss.clipped import ClippedSurrogateLoss, TokenClippedSurrogateLoss
from ludic.training.loss.composite import CompositeLoss, LossTerm
from ludic.training.loss.kl import TokenKLLoss
from ludic.training.loss.mismatch import mis_keep_mask, mismatch_stats, tis_surrogate_factor
from ludic.training.loss.reinforce import ReinforceBaselineLoss, ReinforceLoss
from ludic.training.loss.sft import MaskedCausalLMCrossEntropyLoss

__all__ = [
    "CISPOLoss",
    "ClippedSurrogateLoss",
    "CompositeLoss",
    "Loss",
    "LossTerm",
    "MaskedCausalLMCrossEntropyLoss",
    "ReinforceBaselineLoss",
    "ReinforceLoss",
    "Stats",
    "TokenClippedSurrogateLoss",
    "TokenKLLoss",
    "TokenLogpLoss",
    "compute_logp_action",
    "compute_token_logps",
    "mis_keep_mask",
    "mismatch_stats",
    "seq_reduce",
    "tis_surrogate_factor",
    "token_mean_keys",
]
