"""The papers' token-level aggregation per group (MiniMax-M1 eq. 4, ScaleRL's prompt-level), as item weights.

Ludic's losses average over the batch's items: ``L = mean_i red_t(term_it)``, where ``red_t`` sums an
item's action tokens (``length_normalize=False``) or averages them. MiniMax-M1's CISPO (eq. 4) and
ScaleRL's prompt-level aggregation instead divide a group's summed token terms by the group's total
action tokens ``T_g``, then average over groups. Scaling each item's weight (and token weights) by
``s_g = B / (n_groups * T_g)`` before a summing loss gives exactly that:
``mean_i s_g sum_t term_it = mean_g (1 / T_g) sum_{i in g} sum_t term_it``. The scale is computed on the
whole batch, so the trainer's micro-batch split (which averages over items) does not change it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from ludic.training.types import SAWBatch, SAWItem


def group_token_mean(batch: SAWBatch) -> SAWBatch:
    """``batch`` with each item's weight and token weights scaled by ``B / (n_groups * T_g)`` (see the module
    docstring); its groups are ``meta["group_id"]`` (per ``meta["agent_id"]``). Pair it with a loss that sums
    over tokens (``length_normalize=False``). Raises ValueError for an item without a ``group_id``."""
    if not batch.items:
        return batch
    tokens: dict[tuple[Any, Any], int] = defaultdict(int)
    for item in batch.items:
        if "group_id" not in item.meta:
            raise ValueError(
                f"SAWItem(rollout_id={item.meta.get('rollout_id')!r}) has no meta['group_id']; "
                "group_token_mean needs each item's group"
            )
        tokens[_group(item)] += item.num_action_tokens
    per_group = len(batch.items) / len(tokens)
    batch.items = [_scaled(item, per_group / max(tokens[_group(item)], 1)) for item in batch.items]
    return batch


def _group(item: SAWItem) -> tuple[Any, Any]:
    return item.meta["group_id"], item.meta.get("agent_id")


def _scaled(item: SAWItem, scale: float) -> SAWItem:
    weights = None if item.token_weights is None else [w * scale for w in item.token_weights]
    return dataclasses.replace(item, weight=item.weight * scale, token_weights=weights)
