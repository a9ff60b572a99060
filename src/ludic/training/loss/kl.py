"""Token-level KL penalty towards a frozen model's log-probs carried in the batch.

Estimators (Schulman, "Approximating KL divergence", 2020; the k1/k2/k3 names used by verl, TRL, OpenRLHF),
with ``d_t = ref_logp_t - policy_logp_t`` on tokens sampled by the policy:

    k1_t = -d_t                      unbiased value of KL(pi || ref); its gradient is 0 in expectation
    k2_t = d_t ** 2 / 2              biased value; gradient ``-d_t * grad policy_logp_t``
    k3_t = exp(d_t) - 1 - d_t        unbiased, non-negative value; gradient ``(1 - exp(d_t)) * grad logp_t``

Used as a loss, only k2 gives the gradient of the reverse KL: ``grad KL(pi || ref) = E_pi[(log pi - log
ref) grad log pi] = E_pi[grad k2]``. k3's expected gradient, ``-sum_x ref(x) grad log pi(x)``, is the
gradient of the *forward* KL(ref || pi) (Zhang et al. 2025, "On the Design of KL-Regularized Policy
Gradient Algorithms for LLM Reasoning"); k1's is zero. Ludic therefore defaults to **k2** for the
gradient, and always reports the k3 value (``kl_mean`` or ``stat_key``) as the KL estimate users read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import Batch, Stats, TokenLogpLoss, seq_reduce, token_mean

ESTIMATORS = ("k2", "k3")


@dataclass
class TokenKLLoss(TokenLogpLoss):
    """``L = mean_i[ red_t( k_t ) ]`` with ``k_t`` the chosen estimator (module docstring) of each token's KL.

    ``ref_logps_key``: the batch's [B, T] frozen-model log-probs, aligned with input positions like
    ``actor_logps`` (``"ref_logps"``, filled by ``FrozenModelScorer``; ``"teacher_logps"`` to distil;
    ``"actor_logps"`` pulls towards the sampling policy, which is a no-op with one step per batch).
    ``red_t`` sums over action tokens, or averages with ``length_normalize``. ``stat_key`` names the
    reported mean per-token KL (k3 value). Weight it in a CompositeLoss.
    """

    ref_logps_key: str = "ref_logps"
    length_normalize: bool = False
    estimator: str = "k2"
    stat_key: str = "kl_mean"

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"TokenKLLoss.estimator must be one of {ESTIMATORS}, got {self.estimator!r} "
                "(k1's gradient is zero in expectation, so it cannot serve as a loss)"
            )

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        if self.ref_logps_key not in batch:
            raise KeyError(
                f"{self.owner} needs batch[{self.ref_logps_key!r}], but the batch has only {sorted(batch)}; "
                "a FrozenModelScorer preprocess step fills it (make_cispo(kl_coeff=..., ref_model=...), "
                "make_distill(teacher=...))"
            )
        ref_logps = batch[self.ref_logps_key].to(policy_logps.dtype)  # [B, T]
        d = (ref_logps - policy_logps) * mask  # [B, T], 0 off the action
        k3 = torch.expm1(d) - d  # exp(d) - 1 - d
        per_token = 0.5 * d.square() if self.estimator == "k2" else k3
        loss = seq_reduce(per_token, mask, length_normalize=self.length_normalize).mean()
        with torch.no_grad():
            stats = Stats({"loss": loss.detach()}).add(
                per_token=True,
                **{self.stat_key: token_mean(k3.detach(), mask), "logp_mean": token_mean(policy_logps.detach(), mask)},
            )
        return loss, stats
