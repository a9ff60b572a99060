"""CISPO (MiniMax-M1, arXiv:2506.13585): clip the IS weight, not the update.

PPO's ``min(r A, clip(r) A)`` has zero gradient for a token whose ratio left the clip range, so rare
tokens that just became likelier ("However", "Wait") stop learning. CISPO puts the clipped ratio
under a stop-gradient, so every token keeps its ``grad log pi``; the clip only bounds its weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import (
    Stats,
    TokenLogpLoss,
    action_mask_f,
    require,
    seq_reduce,
    token_advantages,
    token_mean,
)
from ludic.training.loss.mismatch import MismatchGuards, _validate_guards
from ludic.training.shapes import Float, shape_checked


@dataclass
class CISPOLoss(TokenLogpLoss, MismatchGuards):
    """``L = -mean_i[ red_t( sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_i * policy_logp_t ) ]``.

    ``r_t = exp(policy_logp_t - actor_logp_t)``; ``red_t`` averages over action tokens when
    ``length_normalize`` (the default, as in the paper), else sums. The default ``clip_eps_low=1e6``
    leaves the weight unbounded below. ``tis_cap`` further caps the weight: ``sg(min(w_t, tis_cap))``.
    With per-token weights (``batch["token_weight"]``) ``A_i`` becomes ``A_{i,t}``.
    """

    clip_eps_low: float = 1e6
    clip_eps_high: float = 0.2
    length_normalize: bool = True
    tis_cap: float | None = None
    mis_threshold: float | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not self.clip_eps_low >= 0 or not self.clip_eps_high >= 0:
            raise ValueError(
                f"{owner}: clip_eps_low/clip_eps_high must be >= 0, "
                f"got {self.clip_eps_low!r}, {self.clip_eps_high!r}"
            )
        _validate_guards(owner, self.tis_cap, self.mis_threshold)

    @shape_checked
    def compute_from_logps(
        self, policy_logps: Float[Tensor, "B T"], batch: Mapping[str, Tensor]
    ) -> tuple[Float[Tensor, ""], Stats]:
        owner = type(self).__name__
        mask = action_mask_f(batch, owner)  # [B, T]
        adv = token_advantages(batch, owner, policy_logps.dtype)  # A_it [B, T], or A_i [B, 1]
        actor_logps = require(batch, "actor_logps", owner).to(policy_logps.dtype)  # [B, T]
        ratio = torch.exp((policy_logps.detach() - actor_logps) * mask)  # [B, T], no gradient
        is_weight = ratio.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)  # sg(clip(r))
        if self.tis_cap is not None:
            is_weight = is_weight.clamp(max=self.tis_cap)
        per_token = is_weight * adv * policy_logps  # [B, T]
        keep, stats = self._guard_sequences(policy_logps, batch, mask)
        loss = (-seq_reduce(per_token, mask, length_normalize=self.length_normalize) * keep).mean()
        with torch.no_grad():
            clipped = (ratio < 1.0 - self.clip_eps_low) | (ratio > 1.0 + self.clip_eps_high)
            per_token_adv = "token_weight" in batch
            stats.add(loss=loss.detach())
            stats.add(per_token=per_token_adv, adv_mean=token_mean(adv, mask) if per_token_adv else adv.mean())
            stats.add(
                per_token=True,
                logp_mean=token_mean(policy_logps.detach(), mask),
                ratio_mean=token_mean(ratio, mask),
                clip_frac=token_mean(clipped.to(mask.dtype), mask),
            )
        return loss, stats
