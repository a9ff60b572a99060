"""Token-level KL penalty towards reference log-probs carried in the batch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import Stats, TokenLogpLoss, action_mask_f, require, seq_reduce, token_mean


@dataclass
class TokenKLLoss(TokenLogpLoss):
    """``L = mean_i[ red_t( k3_t ) ]``, ``k3_t = exp(d_t) - 1 - d_t``, ``d_t = ref_logp_t - policy_logp_t``.

    k3 (Schulman, "Approximating KL divergence") is an unbiased, always non-negative estimate of
    ``KL(pi || ref)`` from tokens sampled by ``pi``; its gradient w.r.t. ``policy_logp`` is
    ``1 - exp(d)``. The reference log-probs are ``batch[ref_logps_key]`` [B, T], aligned with input
    positions like ``actor_logps``; ``ref_logps_key="actor_logps"`` penalises drift from the
    sampling policy (a soft trust region that needs no reference model). Weight it in a CompositeLoss.
    """

    ref_logps_key: str = "ref_logps"
    length_normalize: bool = False

    def compute_from_logps(self, policy_logps: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, Stats]:
        owner = type(self).__name__
        mask = action_mask_f(batch, owner)  # [B, T]
        ref_logps = require(batch, self.ref_logps_key, owner).to(policy_logps.dtype)  # [B, T]
        d = (ref_logps - policy_logps) * mask
        k3 = torch.expm1(d) - d  # [B, T], 0 off the action
        loss = seq_reduce(k3, mask, length_normalize=self.length_normalize).mean()
        with torch.no_grad():
            stats = {
                "loss": loss.detach(),
                "kl_mean": token_mean(k3.detach(), mask),
                "logp_mean": token_mean(policy_logps.detach(), mask),
            }
        return loss, stats
