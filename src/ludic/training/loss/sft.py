"""Supervised fine-tuning: weighted negative log-likelihood of the action tokens."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ludic.training.loss.base import Batch, Stats, TokenLogpLoss, add_policy_stats, seq_reduce


@dataclass
class MaskedCausalLMCrossEntropyLoss(TokenLogpLoss):
    """``L = -mean_i[ w_i * red_t(policy_logp_t) ]`` over action tokens only (prompt tokens are masked).

    ``w_i`` is ``batch["weight"]`` (1.0 under ``ConstantCredit``), so samples can be re-weighted;
    ``red_t`` sums, or averages per sequence when ``length_normalize``. With per-token weights
    (``batch["token_weight"]``): ``L = -mean_i[ red_t(w_{i,t} * policy_logp_t) ]``.
    """

    length_normalize: bool = False

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        weight = self._require(batch, "weight").to(policy_logps.dtype)  # w_i [B]
        if "token_weight" in batch:
            weight = self._token_advantages(batch, policy_logps.dtype)  # w_it [B, T]
            loss = -seq_reduce(weight * policy_logps, mask, length_normalize=self.length_normalize).mean()
        else:
            nll = -seq_reduce(policy_logps, mask, length_normalize=self.length_normalize)  # [B]
            loss = (weight * nll).mean()
        stats = add_policy_stats(Stats(), batch, mask, loss=loss, policy_logps=policy_logps, adv=weight)
        stats.add(per_token=True, nll_per_token=-stats["logp_mean"])
        return loss, stats
