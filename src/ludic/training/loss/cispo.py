"""CISPO (MiniMax-M1, arXiv:2506.13585): clip the IS weight, not the update.

PPO's ``min(r A, clip(r) A)`` has zero gradient for a token whose ratio left the clip range, so rare
tokens that just became likelier ("However", "Wait") stop learning. CISPO puts the clipped ratio
under a stop-gradient, so every token keeps its ``grad log pi``; the clip only bounds its weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import Batch, Stats, TokenLogpLoss, add_policy_stats, seq_reduce, token_mean
from ludic.training.loss.clipped import validate_clip
from ludic.training.loss.mismatch import MismatchGuards


@dataclass
class CISPOLoss(TokenLogpLoss, MismatchGuards):
    """``L = -mean_i[ red_t( sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_i * policy_logp_t ) ]``.

    ``r_t = exp(policy_logp_t - actor_logp_t)``; ``red_t`` averages over action tokens when
    ``length_normalize`` (the default), else sums; ``mean_i`` is over the batch's sequences.

    Aggregation, exactly: with ``length_normalize`` each sequence weighs the same (its tokens
    ``1 / (B |o_i|)`` each); without, each token of the batch weighs ``1 / B``. Neither is the paper's:
    MiniMax-M1 (eq. 4) divides a group's summed token terms by the group's total tokens
    ``sum_i |o_i|``, so every token of a group weighs the same. ``length_normalize=False`` matches
    that within one group up to a constant scale (``sum_i |o_i| / B``); across groups the paper weighs
    the tokens of short-reply groups more. ``length_normalize=True`` differs whenever lengths differ
    (gradient cosine 0.69 to the paper's on a batch of replies of 1 and 4 tokens). The paper's aggregation
    exactly: ``make_cispo(length_normalize=False, group_token_mean=True)``, which scales each item's weight
    by its group's token count (``training/credit/group_token_mean.py``). The default ``clip_eps_low=1e6``
    leaves the weight unbounded below. ``tis_cap`` further caps the weight: ``sg(min(w_t, tis_cap))``.
    With per-token weights (``batch["token_weight"]``) ``A_i`` becomes ``A_{i,t}``.
    """

    clip_eps_low: float = 1e6
    clip_eps_high: float = 0.2
    length_normalize: bool = True
    tis_cap: float | None = None
    mis_threshold: float | None = None

    def __post_init__(self) -> None:
        validate_clip(self, self.clip_eps_low, self.clip_eps_high)

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        ratio = self._token_ratio(policy_logps.detach(), batch, mask)  # r_t [B, T], no gradient
        is_weight = ratio.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)  # sg(clip(r))
        if self.tis_cap is not None:
            is_weight = is_weight.clamp(max=self.tis_cap)
        adv = self._token_advantages(batch, policy_logps.dtype)  # A_it [B, T], or A_i [B, 1]
        per_token = is_weight * adv * policy_logps  # [B, T]
        keep, stats = self._guard_sequences(policy_logps, batch, mask)
        loss = (-seq_reduce(per_token, mask, length_normalize=self.length_normalize) * keep).mean()
        with torch.no_grad():
            clipped = (ratio < 1.0 - self.clip_eps_low) | (ratio > 1.0 + self.clip_eps_high)
            add_policy_stats(stats, batch, mask, loss=loss, policy_logps=policy_logps, adv=adv)
            clip_frac = token_mean(clipped.to(mask.dtype), mask)
            stats.add(per_token=True, ratio_mean=token_mean(ratio, mask), clip_frac=clip_frac)
        return loss, stats
