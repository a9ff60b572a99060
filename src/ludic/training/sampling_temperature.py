"""Score actions under the distribution they were sampled from: the sampling temperature.

The engine (and vLLM with ``--logprobs-mode processed_logprobs``) returns log-probs of
softmax(logits / T). For the importance ratio pi_theta / pi_old to compare like with like, the
trainer computes its log-probs from logits / T too, with each item's own T (recorded by the agent
in ``meta["sampling_temperature"]``). Greedy (T = 0) and items without a recorded T use T = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ludic.training.types import SAWItem


def item_temperature(item: SAWItem) -> float:
    """The temperature ``item`` was sampled at (1.0 when greedy or unknown)."""
    t = item.meta.get("sampling_temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
        return 1.0
    return float(t)


def item_temperatures(items: Sequence[SAWItem], device: torch.device | str) -> torch.Tensor | None:
    """``[B]`` sampling temperatures of ``items``, or None when all are 1 (nothing to rescale)."""
    temps = [item_temperature(it) for it in items]
    if all(t == 1.0 for t in temps):
        return None
    return torch.tensor(temps, dtype=torch.float32, device=device)


def apply_sampling_temperature(logits: torch.Tensor, items: Sequence[SAWItem]) -> torch.Tensor:
    """``logits`` [B, T, V] divided row-wise by each item's sampling temperature."""
    temps = [item_temperature(it) for it in items]
    if len(temps) != logits.shape[0]:
        raise ValueError(f"apply_sampling_temperature: {len(temps)} items for {logits.shape[0]} logit rows")
    if all(t == 1.0 for t in temps):
        return logits
    t = torch.tensor(temps, dtype=logits.dtype, device=logits.device)  # [B]
    return logits / t[:, None, None]


def nucleus_sampled(item: SAWItem) -> bool:
    """True when ``item`` was sampled with top_p < 1 (its log-probs are of a truncated distribution)."""
    top_p = item.meta.get("sampling_top_p")
    return isinstance(top_p, (int, float)) and not isinstance(top_p, bool) and top_p < 1.0
