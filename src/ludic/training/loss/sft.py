"""Supervised fine-tuning: weighted negative log-likelihood of the action tokens."""

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
from ludic.training.shapes import Float, shape_checked


@dataclass
class MaskedCausalLMCrossEntropyLoss(TokenLogpLoss):
    """``L = -mean_i[ w_i * red_t(policy_logp_t) ]`` over action tokens only (prompt tokens are masked).

    ``w_i`` is ``batch["weight"]`` (1.0 under ``ConstantCredit``), so samples can be re-weighted;
    ``red_t`` sums, or averages per sequence when ``length_normalize``. With per-token weights
    (``batch["token_weight"]``): ``L = -mean_i[ red_t(w_{i,t} * policy_logp_t) ]``.
    """

    length_normalize: bool = False

    @shape_checked
    def compute_from_logps(
        self, policy_logps: Float[Tensor, "B T"], batch: Mapping[str, Tensor]
    ) -> tuple[Float[Tensor, ""], Stats]:
        owner = type(self).__name__
        mask = action_mask_f(batch, owner)  # [B, T]
        weight = require(batch, "weight", owner).to(policy_logps.dtype)  # [B]
        if "token_weight" in batch:
            w_t = token_advantages(batch, owner, policy_logps.dtype)  # [B, T]
            loss = -seq_reduce(w_t * policy_logps, mask, length_normalize=self.length_normalize).mean()
            weight_mean = token_mean(w_t, mask)
        else:
            nll = -seq_reduce(policy_logps, mask, length_normalize=self.length_normalize)  # [B]
            loss = (weight * nll).mean()
            weight_mean = weight.mean()
        with torch.no_grad():
            logp_mean = token_mean(policy_logps.detach(), mask)
            stats = Stats({"loss": loss.detach()}).add(per_token=True, nll_per_token=-logp_mean, logp_mean=logp_mean)
            stats.add(per_token="token_weight" in batch, adv_mean=weight_mean)
        return loss, stats
