"""REINFORCE with a sequence-level importance-sampling correction, and its batch-baseline variant."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import Batch, Stats, TokenLogpLoss, add_policy_stats, seq_reduce
from ludic.training.loss.mismatch import MismatchGuards, _validate_guards


@dataclass
class ReinforceLoss(TokenLogpLoss, MismatchGuards):
    """``L = -mean_i[ sg(w_i) * A_i * logp_i ]`` (migration guide: ``-E[sg(r) * A * log pi]``).

    - ``logp_i`` = sum of the policy's log-probs over the action (divided by the action length when
      ``length_normalize``); ``A_i`` = ``batch["weight"]``.
    - ``r_i = exp(sum_t policy_logp - batch[old_logp_key])``: the whole-sequence ratio to the actor
      (always the full sum, also under ``length_normalize``). ``old_logp_key=None`` disables the
      correction (``r = 1``, plain REINFORCE: ``-E[A * log pi]``).
    - ``w_i = min(r_i, tis_cap)`` with ``tis_cap``; sequences masked by ``mis_threshold`` add 0.
    - Per-token weights (``batch["token_weight"]``, ``A_{i,t}``): ``L = -mean_i[ sg(w_i) *
      red_t(A_{i,t} * logp_{i,t}) ]`` (``red_t`` sums, or averages under ``length_normalize``); equal to
      the form above when every ``A_{i,t} = A_i``. ``r_i`` stays the whole sequence's ratio.
    """

    length_normalize: bool = False
    old_logp_key: str | None = "old_logp_action"
    tis_cap: float | None = None
    mis_threshold: float | None = None

    def __post_init__(self) -> None:
        _validate_guards(self.owner, self.tis_cap, self.mis_threshold)

    def _advantages(self, batch: Batch) -> Tensor:
        return self._require(batch, "weight").to(torch.float32)

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        seq_logp = seq_reduce(policy_logps, mask, length_normalize=self.length_normalize)  # [B]
        if self.old_logp_key is None:
            ratio = torch.ones_like(seq_logp)
        else:
            old = self._require(batch, self.old_logp_key).to(seq_logp.dtype)  # [B]
            full_logp = seq_reduce(policy_logps, mask, length_normalize=False)
            ratio = torch.exp(full_logp.detach() - old)  # r_i, no gradient
        is_weight = ratio if self.tis_cap is None else ratio.clamp(max=self.tis_cap)
        keep, stats = self._guard_sequences(policy_logps, batch, mask)
        if "token_weight" in batch:  # per-token credit: -sg(w_i) * red_t(A_it * logp_it)
            adv = self._token_advantages(batch, policy_logps.dtype)  # A_it [B, T]
            weighted = seq_reduce(adv * policy_logps, mask, length_normalize=self.length_normalize)
            per_seq = -is_weight * weighted * keep  # [B]
        else:
            adv = self._advantages(batch)  # A_i [B]
            per_seq = -is_weight * adv * seq_logp * keep  # [B]
        loss = per_seq.mean()
        with torch.no_grad():
            add_policy_stats(stats, batch, mask, loss=loss, policy_logps=policy_logps, adv=adv)
            stats["ratio_mean"] = ratio.mean()  # r_i: one per sequence
            if self.tis_cap is not None:
                stats["tis_clip_frac"] = (ratio > self.tis_cap).float().mean()
        return loss, stats


@dataclass
class ReinforceBaselineLoss(ReinforceLoss):
    """REINFORCE with the batch-mean baseline: ``A_i = w_i - mean_j(w_j)`` (``/ (std + 1e-8)`` if ``normalize``).

    The baseline is taken over the batch this loss sees, i.e. the micro-batch: its gradient depends
    on how the trainer splits a macro-batch. ``make_reinforce_baseline`` therefore centres the
    weights over the whole macro-batch in preprocessing and uses ``ReinforceLoss`` instead.
    """

    normalize: bool = False

    def _token_advantages(self, batch: Batch, dtype: torch.dtype) -> Tensor:
        raise ValueError(
            "ReinforceBaselineLoss centres one weight per sequence over the micro-batch, but this batch "
            "has per-token weights (batch['token_weight']); centre them over the macro-batch instead "
            "(make_reinforce_baseline: center_weights preprocessing + ReinforceLoss)"
        )

    def _advantages(self, batch: Batch) -> Tensor:
        weight = super()._advantages(batch)
        adv = weight - weight.mean()
        if self.normalize:
            adv = adv / (weight.std(unbiased=False) + 1e-8)
        return adv
