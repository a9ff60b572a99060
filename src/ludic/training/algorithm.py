"""An RL algorithm is a credit assigner plus a loss (plus optional batch preprocessing).

Preprocessing functions take and return a ``SAWBatch``; they edit it in place (items and
``meta["effective_rollouts"]``, the number of distinct ``rollout_id`` left) so the Trainer's stats
see the result. The presets (``make_grpo``, ...) live in ``ludic.training.presets`` and are
re-exported here.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ludic.training.credit.assigners import group_mean
from ludic.training.loss.base import Loss
from ludic.training.sampling_temperature import nucleus_sampled
from ludic.training.types import CreditAssigner, SAWBatch, SAWItem

PreprocessFn = Callable[[SAWBatch], SAWBatch]
"""Validates/filters a macro-batch before it is split and collated (applied by the Trainer)."""


@dataclass
class RLAlgorithm:
    """Bundle of how rewards become weights (``credit_assigner``) and weights become gradients (``loss``)."""

    name: str
    credit_assigner: CreditAssigner
    loss: Loss
    preprocess: PreprocessFn | None = None


def _where(item: SAWItem) -> str:
    return f"rollout_id={item.meta.get('rollout_id')!r}, step_index={item.meta.get('step_index')!r}"


def set_items(batch: SAWBatch, items: list[SAWItem]) -> SAWBatch:
    """Replace ``batch.items`` and recount ``batch.meta["effective_rollouts"]`` (in place)."""
    batch.items = items
    ids = {it.meta.get("rollout_id", f"<item {i}>") for i, it in enumerate(items)}
    batch.meta["effective_rollouts"] = len(ids)
    return batch


def validate_actor_logps(batch: SAWBatch) -> SAWBatch:
    """Fail early, naming the item, when a ratio-based loss would get an item without actor logprobs."""
    for item in batch.items:
        if item.attachments.actor_logps is None:
            raise ValueError(
                f"SAWItem({_where(item)}) has no actor logprobs (attachments.actor_logps); ratio-based "
                "losses need them: use an inference client that returns completion logprobs, or a "
                "loss without importance ratios (make_sft, ReinforceLoss(old_logp_key=None))"
            )
        if nucleus_sampled(item):
            raise ValueError(
                f"SAWItem({_where(item)}) was sampled with top_p={item.meta['sampling_top_p']}: its "
                "log-probs are of the nucleus-truncated distribution, which the trainer cannot "
                "recompute, so the importance ratio would be biased; sample with top_p=1.0 for "
                "ratio-based losses (temperature is fine: the trainer rescales by it)"
            )
    return set_items(batch, list(batch.items))


def drop_zero_weight(batch: SAWBatch) -> SAWBatch:
    """Drop items whose credit weight is exactly 0 (they add no gradient, only normaliser mass).

    An item with per-token weights is dropped only when every one of them is 0.
    """
    return set_items(batch, [it for it in batch.items if any(w != 0.0 for w in _token_credit(it))])


def _token_credit(item: SAWItem) -> list[float]:
    return [item.weight] if item.token_weights is None else item.token_weights


def credit_units(item: SAWItem) -> list[float]:
    """The item's credit, one value per unit: ``[weight]``, or with per-token weights one value per
    action span (a maximal run of action tokens, i.e. one model call): the mean of its weights."""
    if item.token_weights is None:
        return [float(item.weight)]
    units: list[list[float]] = []
    k, inside = 0, False
    for flag in item.action_mask:
        if flag:
            if not inside:
                units.append([])
            units[-1].append(item.token_weights[k])
            k += 1
        inside = bool(flag)
    return [statistics.fmean(u) for u in units]


def drop_zero_variance_groups(batch: SAWBatch) -> SAWBatch:
    """ScaleRL's zero-variance filter: drop every group (``meta["group_id"]``, per ``agent_id``) whose
    items all have the same ``meta["total_reward"]``: such a prompt carries no learning signal."""
    groups: dict[tuple[Any, Any], list[SAWItem]] = defaultdict(list)
    for item in batch.items:
        for key in ("group_id", "total_reward"):
            if key not in item.meta:
                raise ValueError(f"SAWItem({_where(item)}) has no meta[{key!r}]; filter_zvp needs it")
        groups[(item.meta["group_id"], item.meta.get("agent_id"))].append(item)
    keep = {
        key for key, members in groups.items() if len({float(it.meta["total_reward"]) for it in members}) > 1
    }
    items = [it for it in batch.items if (it.meta["group_id"], it.meta.get("agent_id")) in keep]
    return set_items(batch, items)


def center_weights(normalize: bool = False) -> PreprocessFn:
    """Batch-mean baseline over the whole macro-batch: ``w_i - mean(w)`` (``/ (std(w) + 1e-8)``).

    Done here rather than in the loss so the result does not depend on the micro-batch split. The
    mean and std run over ``credit_units``: an item with per-token weights counts once per action
    span (a one-sequence episode is centred as its per-call items would be), and its token weights
    are shifted and scaled like ``weight``.
    """

    def _center(batch: SAWBatch) -> SAWBatch:
        if not batch.items:
            return set_items(batch, [])
        weights = [w for it in batch.items for w in credit_units(it)]
        if not weights:
            return set_items(batch, list(batch.items))
        mean = group_mean(weights)  # correctly rounded: tied weights centre to exactly 0; w_i - mean(w)
        scale = statistics.pstdev(weights) + 1e-8 if normalize else 1.0
        for item in batch.items:
            item.weight = (item.weight - mean) / scale
            if item.token_weights is not None:
                item.token_weights = [(w - mean) / scale for w in item.token_weights]
        return set_items(batch, list(batch.items))

    return _center


def chain_preprocess(*fns: PreprocessFn | None) -> PreprocessFn | None:
    """Apply the given preprocessing functions in order (``None`` entries skipped)."""
    steps = [f for f in fns if f is not None]
    if len(steps) <= 1:
        return steps[0] if steps else None  # one step is its own chain

    def _chained(batch: SAWBatch) -> SAWBatch:
        for step in steps:
            batch = step(batch)
        return batch

    return _chained


_PRESETS = {
    "build_preset": "presets",
    "make_cispo": "presets",
    "make_distill": "distill",
    "make_grpo": "presets",
    "make_gspo": "presets",
    "make_reinforce": "presets",
    "make_reinforce_baseline": "presets",
    "make_scalerl": "presets",
    "make_sft": "presets",
}


def __getattr__(name: str) -> Any:
    # Presets import this module, so re-export them lazily instead of importing at the top.
    if name in _PRESETS:
        import importlib

        return getattr(importlib.import_module(f"ludic.training.{_PRESETS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
