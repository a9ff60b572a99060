"""PPO-style clipped surrogates: per token (GRPO) and per sequence (GSPO)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ludic.training.loss.base import Batch, Stats, TokenLogpLoss, add_policy_stats, seq_reduce, token_mean
from ludic.training.loss.mismatch import MismatchGuards, _validate_guards, tis_surrogate_factor


def validate_clip(
    loss: MismatchGuards, eps_low: float, eps_high: float, ratio_clip: float | None = None
) -> None:
    """A ratio loss's clip range (PPO clip or CISPO's IS-weight clip), ``ratio_clip`` and TIS/MIS guards."""
    owner = type(loss).__name__
    if not eps_low >= 0 or not eps_high >= 0:
        raise ValueError(f"{owner}: clip_eps_low/clip_eps_high must be >= 0, got {eps_low!r}, {eps_high!r}")
    if ratio_clip is not None and not ratio_clip > 0:
        raise ValueError(f"{owner}.ratio_clip must be > 0 or None, got {ratio_clip!r}")
    _validate_guards(owner, loss.tis_cap, loss.mis_threshold)


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, ratio_clip: float | None
) -> tuple[Tensor, Tensor]:
    """``min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = min(r, ratio_clip)`` first.

    Returns the surrogate and a bool mask of where the clip won (no gradient flows there).
    """
    if ratio_clip is not None:
        ratio = ratio.clamp(max=ratio_clip)  # hard cap before the PPO min
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), (clipped < unclipped).detach()


@dataclass
class TokenClippedSurrogateLoss(TokenLogpLoss, MismatchGuards):
    """Token-level PPO clip (GRPO): ``L = -mean_i[ red_t( min(r_t A_i, clip(r_t) A_i) ) ]``.

    ``r_t = exp(policy_logp_t - actor_logp_t)``; ``red_t`` sums over action tokens, or averages
    when ``length_normalize``. With per-token weights (``batch["token_weight"]``) ``A_i`` becomes
    ``A_{i,t}``: ``min(r_t A_{i,t}, clip(r_t) A_{i,t})``. With ``tis_cap`` each token's surrogate is multiplied by
    ``sg(min(1, tis_cap / r_t))`` (see ``mismatch``); MIS-masked sequences add 0.
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.27
    length_normalize: bool = False
    ratio_clip: float | None = None
    tis_cap: float | None = None
    mis_threshold: float | None = None

    def __post_init__(self) -> None:
        validate_clip(self, self.clip_eps_low, self.clip_eps_high, self.ratio_clip)

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        adv = self._token_advantages(batch, policy_logps.dtype)  # A_it [B, T], or A_i [B, 1]
        ratio = self._token_ratio(policy_logps, batch, mask)  # r_t [B, T]; 1 off the action
        surr, clipped = clipped_surrogate(ratio, adv, self.clip_eps_low, self.clip_eps_high, self.ratio_clip)
        surr = surr * tis_surrogate_factor(ratio, self.tis_cap)
        keep, stats = self._guard_sequences(policy_logps, batch, mask)
        per_seq = -seq_reduce(surr, mask, length_normalize=self.length_normalize) * keep  # [B]
        loss = per_seq.mean()
        with torch.no_grad():
            add_policy_stats(stats, batch, mask, loss=loss, policy_logps=policy_logps, adv=adv)
            clip_frac = token_mean(clipped.to(mask.dtype), mask)
            stats.add(per_token=True, ratio_mean=token_mean(ratio, mask), clip_frac=clip_frac)
            if self.ratio_clip is not None:
                stats.add(per_token=True, ratio_clip_frac=token_mean((ratio > self.ratio_clip).to(mask.dtype), mask))
        return loss, stats


@dataclass
class ClippedSurrogateLoss(TokenLogpLoss, MismatchGuards):
    """Sequence-level PPO clip (GSPO, arXiv:2507.18071): ``L = -mean_i[ min(s_i A_i, clip(s_i) A_i) ]``.

    ``s_i = exp((logp_i - old_i) / |y_i|)`` (geometric-mean token ratio) when ``length_normalize``,
    else ``exp(logp_i - old_i)``; ``logp_i`` sums the policy's action log-probs and ``old_i`` is
    ``batch[old_logp_key]``. ``tis_cap`` multiplies by ``sg(min(1, tis_cap / s_i))``.

    Per-token weights (``batch["token_weight"]``, ``A_{i,t}``): the surrogate is averaged over the
    action tokens, ``mean_t min(s_i A_{i,t}, clip(s_i) A_{i,t})``, which is the form above when every
    ``A_{i,t} = A_i``. The ratio stays the sequence's: unlike the token-level losses this is not the
    sum of per-turn items' losses (each of those has its own ``s``).
    """

    clip_eps_low: float = 3e-4
    clip_eps_high: float = 4e-4
    length_normalize: bool = True
    ratio_clip: float | None = None
    old_logp_key: str = "old_logp_action"
    tis_cap: float | None = None
    mis_threshold: float | None = None

    def __post_init__(self) -> None:
        validate_clip(self, self.clip_eps_low, self.clip_eps_high, self.ratio_clip)

    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        adv = self._require(batch, "weight").to(policy_logps.dtype)  # A_i [B]
        old = self._require(batch, self.old_logp_key).to(policy_logps.dtype)  # [B]
        log_ratio = seq_reduce(policy_logps, mask, length_normalize=False) - old  # [B]
        if self.length_normalize:
            log_ratio = log_ratio / mask.sum(-1).clamp(min=1.0)
        ratio = torch.exp(log_ratio)  # s_i [B]
        eps = (self.clip_eps_low, self.clip_eps_high, self.ratio_clip)
        if "token_weight" in batch:  # mean_t min(s_i A_it, clip(s_i) A_it) over action tokens
            adv = self._token_advantages(batch, policy_logps.dtype)  # A_it [B, T]
            surr_t, clipped_t = clipped_surrogate(ratio[:, None].expand_as(adv), adv, *eps)
            surr = seq_reduce(surr_t, mask, length_normalize=True)  # [B]
            clip_frac = token_mean(clipped_t.to(mask.dtype), mask)
        else:
            surr, clipped = clipped_surrogate(ratio, adv, *eps)
            clip_frac = clipped.to(mask.dtype).mean()
        surr = surr * tis_surrogate_factor(ratio, self.tis_cap)
        keep, stats = self._guard_sequences(policy_logps, batch, mask)
        loss = (-surr * keep).mean()
        with torch.no_grad():
            add_policy_stats(stats, batch, mask, loss=loss, policy_logps=policy_logps, adv=adv)
            stats["ratio_mean"] = ratio.detach().mean()  # s_i: one per sequence
            stats.add(per_token="token_weight" in batch, clip_frac=clip_frac)
            if self.ratio_clip is not None:
                stats["ratio_clip_frac"] = (ratio > self.ratio_clip).to(mask.dtype).mean()
        return loss, stats
