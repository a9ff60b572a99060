"""Inference/trainer mismatch: what it is, how big it is, and the two guards against it (TIS, MIS).

The inference engine (vLLM, or our embedded engine) and the trainer compute log-probs with different
kernels, so even on-policy ``actor_logps`` differ from the trainer's ``policy_logps``. In Ludic the
"old" policy of every ratio loss IS the actor (one optimizer step per batch), so the ratio
``r = pi_theta / pi_actor`` carries both the policy change and this mismatch.

- TIS (truncated importance sampling, Yao et al. 2025, "Your efficient RL framework secretly brings
  you off-policy RL training"): the IS weight that multiplies ``grad log pi`` is truncated at
  ``tis_cap``. A loss whose weight is ``sg(w)`` uses ``sg(min(w, tis_cap))``; a PPO-style surrogate
  ``r * A`` is multiplied by ``sg(min(1, tis_cap / r))`` so its gradient weight becomes ``min(r, tis_cap)``
  while the gradient still flows. Departure from the paper: there is no separate trainer-side "old"
  recomputation, so the cap applies to the whole ratio.
- MIS (masked importance sampling): a sequence whose mean ``|policy_logp - actor_logp|`` over its
  action tokens exceeds ``mis_threshold`` contributes 0 to the loss (it still counts in the mean
  over sequences, so gradient accumulation stays split-independent).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ludic.training.loss.base import Stats, require, seq_reduce, token_mean
from ludic.training.shapes import Float, Shaped, shape_checked


def _validate_guards(owner: str, tis_cap: float | None, mis_threshold: float | None) -> None:
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"{owner}.tis_cap must be > 0 or None, got {tis_cap!r}")
    if mis_threshold is not None and not mis_threshold >= 0:
        raise ValueError(f"{owner}.mis_threshold must be >= 0 or None, got {mis_threshold!r}")


def tis_surrogate_factor(ratio: Tensor, tis_cap: float | None) -> Tensor:
    """``sg(min(1, tis_cap / r))``: turns a surrogate's gradient weight ``r`` into ``min(r, tis_cap)``."""
    if tis_cap is None:
        return torch.ones_like(ratio)
    return (tis_cap / ratio.detach()).clamp(max=1.0)


@shape_checked
def mis_keep_mask(
    policy_logps: Float[Tensor, "B T"],
    actor_logps: Float[Tensor, "B T"],
    mask: Shaped[Tensor, "B T"],
    mis_threshold: float | None,
) -> Float[Tensor, " B"]:
    """[B] float: 1 for sequences to keep, 0 where mean |policy - actor| over action tokens > threshold."""
    if mis_threshold is None:
        return torch.ones(policy_logps.shape[0], dtype=torch.float32, device=policy_logps.device)
    abs_diff = (policy_logps.detach() - actor_logps).abs()
    per_seq = seq_reduce(abs_diff, mask, length_normalize=True)
    return (per_seq <= mis_threshold).to(torch.float32)


@torch.no_grad()
@shape_checked
def mismatch_stats(
    policy_logps: Float[Tensor, "B T"], actor_logps: Float[Tensor, "B T"], mask: Shaped[Tensor, "B T"]
) -> Stats:
    """``mismatch_abs_mean`` = mean |policy - actor| over action tokens; ``mismatch_kl`` = k3 estimate
    of KL(actor || policy) with the actor's samples: ``exp(d) - 1 - d``, ``d = policy - actor``."""
    d = policy_logps.detach() - actor_logps
    return Stats().add(
        per_token=True,
        mismatch_abs_mean=token_mean(d.abs(), mask),
        mismatch_kl=token_mean(torch.expm1(d) - d, mask),
    )


class MismatchGuards:
    """Shared by the ratio losses: ``tis_cap`` / ``mis_threshold`` attributes and their stats."""

    tis_cap: float | None
    mis_threshold: float | None

    def _token_ratio(self, policy_logps: Tensor, batch: Mapping[str, Tensor], mask: Tensor) -> Tensor:
        """``r_t = exp(policy_logp_t - actor_logp_t)`` [B, T] on action tokens, 1 elsewhere (detach
        ``policy_logps`` first for a ratio without gradient)."""
        actor_logps = require(batch, "actor_logps", type(self).__name__).to(policy_logps.dtype)  # [B, T]
        return torch.exp((policy_logps - actor_logps) * mask)

    def _guard_sequences(
        self, policy_logps: Tensor, batch: Mapping[str, Tensor], mask: Tensor
    ) -> tuple[Tensor, Stats]:
        """MIS keep-mask [B] plus mismatch stats (when the batch has ``actor_logps``)."""
        owner = type(self).__name__
        if "actor_logps" not in batch:
            if self.mis_threshold is not None:
                require(batch, "actor_logps", f"{owner}(mis_threshold={self.mis_threshold})")
            return torch.ones(policy_logps.shape[0], device=policy_logps.device), Stats()
        actor_logps = batch["actor_logps"].to(policy_logps.dtype)
        keep = mis_keep_mask(policy_logps, actor_logps, mask, self.mis_threshold)
        stats = mismatch_stats(policy_logps, actor_logps, mask)
        if self.mis_threshold is not None:
            stats["mis_masked_frac"] = 1.0 - keep.mean()
        return keep, stats
