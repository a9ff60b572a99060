"""Declarative per-batch statistics (``Reducer``) and on-device aggregation of loss stats."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ludic.training.types import SAWItem

ReducerKind = Literal["mean", "sum", "count_true"]
_KINDS = ("mean", "sum", "count_true")
_NORMALIZERS = (None, "samples", "rollouts")
_MISSING = object()


@dataclass(frozen=True)
class Reducer:
    """One statistic computed over a batch's items.

    kind: "mean" (average of values), "sum" (total) or "count_true" (number of truthy values).
    source: dotted path into ``SAWItem.meta`` ("request_meta.group_id") or a callable ``item -> value``.
        Items where the path is missing (or the callable returns None) are skipped.
    normalize_by: None (raw), "samples" (divide by the number of items) or "rollouts" (by the number of
        distinct rollouts); only for "sum" and "count_true".
    transform: applied to each value first (``lambda v: v == "win"``).
    as_percent: multiply the result by 100.
    """

    kind: ReducerKind
    source: str | Callable[[Any], Any]
    normalize_by: Literal["samples", "rollouts"] | None = None
    transform: Callable[[Any], Any] | None = None
    as_percent: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"Reducer.kind must be one of {_KINDS}, got {self.kind!r}")
        if not (callable(self.source) or (isinstance(self.source, str) and self.source)):
            raise ValueError(f"Reducer.source must be a dotted meta path or a callable, got {self.source!r}")
        if self.normalize_by not in _NORMALIZERS:
            raise ValueError(f"Reducer.normalize_by must be one of {_NORMALIZERS}, got {self.normalize_by!r}")
        if self.kind == "mean" and self.normalize_by is not None:
            raise ValueError(
                f"Reducer(kind='mean') is already normalised; normalize_by={self.normalize_by!r} would "
                "divide twice: use kind='sum' with normalize_by, or drop normalize_by"
            )


def default_reducers() -> dict[str, Reducer]:
    """Rates every run wants: completions cut by max_tokens, samples cut by max_seq_len."""
    return {
        "completion_truncated_rate": Reducer(
            kind="count_true",
            source="finish_reason",
            transform=lambda v: v == "length",
            normalize_by="samples",
        ),
        "seq_len_truncated_rate": Reducer(
            kind="count_true", source="seq_len_truncated", normalize_by="samples"
        ),
    }


def _lookup(record: SAWItem | Mapping[str, Any], source: str | Callable[[Any], Any]) -> Any:
    if callable(source):
        value = source(record)
        return _MISSING if value is None else value
    node: Any = record.meta if isinstance(record, SAWItem) else record
    for part in source.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return _MISSING if node is None else node


def _rollout_count(records: Sequence[SAWItem | Mapping[str, Any]]) -> int:
    ids = {_lookup(r, "rollout_id") for r in records} - {_MISSING}
    return len(ids) if ids else len(records)


def apply_reducers_to_records(
    records: Sequence[SAWItem | Mapping[str, Any]],
    reducers: Mapping[str, Reducer],
    *,
    num_rollouts: int | None = None,
) -> dict[str, float]:
    """Evaluate ``reducers`` over ``records`` (SAWItems, or plain meta dicts).

    ``num_rollouts`` defaults to the number of distinct ``meta["rollout_id"]``. A "mean" with no
    values is left out rather than reported as 0.
    """
    n_rollouts = num_rollouts if num_rollouts is not None else _rollout_count(records)
    out: dict[str, float] = {}
    for name, red in reducers.items():
        values = [v for v in (_lookup(r, red.source) for r in records) if v is not _MISSING]
        if red.transform is not None:
            values = [red.transform(v) for v in values]
        if red.kind == "count_true":
            total = float(sum(1 for v in values if v))
        else:
            total = float(sum(float(v) for v in values))
        if red.kind == "mean":
            if not values:
                continue
            total /= len(values)
        elif red.normalize_by == "samples":
            total = total / len(records) if records else 0.0
        elif red.normalize_by == "rollouts":
            total = total / n_rollouts if n_rollouts else 0.0
        out[name] = total * 100.0 if red.as_percent else total
    return out


@dataclass(frozen=True)
class MicroBatchWeight:
    """A micro-batch's weight in ``aggregate_stats``, per stat: its action-token count for the stats its
    loss marks as token means (``Stats.token_means``: ``kl_ref``, ``clip_frac``...), its item count for
    the others (``loss``: a mean over sequences, item-weighted as documented). So weighted, neither
    kind of stat depends on how the batch was split."""

    items: float
    action_tokens: float
    token_means: frozenset[str] = frozenset()

    @classmethod
    def of(cls, stats: Mapping[str, Any], *, items: int, action_tokens: int) -> MicroBatchWeight:
        """The weight of a micro-batch of ``items`` sequences and ``action_tokens`` whose loss reported ``stats``."""
        return cls(float(items), float(action_tokens), frozenset(getattr(stats, "token_means", ())))

    def weight(self, key: str) -> float:
        return self.action_tokens if key in self.token_means else self.items


StatWeight = float | MicroBatchWeight
"""A micro-batch's weight in ``aggregate_stats``: one number for every stat, or per stat."""


def stat_weight(weight: StatWeight, key: str) -> float:
    """``weight`` for the stat ``key``."""
    return weight.weight(key) if isinstance(weight, MicroBatchWeight) else float(weight)


def aggregate_stats(
    micro_stats: Sequence[Mapping[str, torch.Tensor | float]],
    weights: Sequence[StatWeight],
) -> dict[str, float]:
    """Weighted mean of each key over micro-batches, with one device-to-host transfer.

    ``weights[i]`` is micro-batch ``i``'s weight, for every key or per key (``MicroBatchWeight``).
    Values stay on their device while they are summed; ``torch.stack(...).cpu()`` happens once at
    the end, so N stats cost one synchronisation instead of N. A key missing from a micro-batch is
    averaged over the micro-batches that have it.
    """
    if len(micro_stats) != len(weights):
        raise ValueError(f"aggregate_stats got {len(micro_stats)} stat dicts but {len(weights)} weights")
    sums: dict[str, torch.Tensor] = {}
    totals: dict[str, float] = {}
    for stats, weight in zip(micro_stats, weights):
        for key, value in stats.items():
            w = stat_weight(weight, key)
            t = value.detach().float().reshape(()) if torch.is_tensor(value) else torch.tensor(float(value))
            contrib = t * w
            if key in sums:
                sums[key] = sums[key] + contrib.to(sums[key].device)
            else:
                sums[key] = contrib
            totals[key] = totals.get(key, 0.0) + w
    if not sums:
        return {}
    keys = list(sums)
    device = next(iter(sums.values())).device
    stacked = torch.stack([sums[k].to(device) for k in keys]).cpu().tolist()
    return {k: (v / totals[k] if totals[k] else math.nan) for k, v in zip(keys, stacked)}


def step_batch_stats(
    batch_meta: Mapping[str, Any], used: Sequence[SAWItem], reducers: Mapping[str, Reducer]
) -> dict[str, float]:
    """A step's batch stats: the batch source's numeric meta (counters it reports), the summary of the
    items trained on (``batch_summary``) and the reducers over them."""
    meta = {k: float(v) for k, v in batch_meta.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**meta, **batch_summary(used, batch_meta), **apply_reducers_to_records(used, reducers)}


def batch_summary(items: Sequence[SAWItem], batch_meta: Mapping[str, Any]) -> dict[str, float]:
    """The per-batch counters every step reports (guide section 5), recomputed on the surviving items.

    ``num_samples``/``effective_rollouts``/averages describe the items actually trained on;
    ``target_rollouts``/``failed_rollouts`` come from the batch source's meta.
    """
    out: dict[str, float] = {}
    for key in ("target_rollouts", "failed_rollouts"):
        if isinstance(batch_meta.get(key), (int, float)):
            out[key] = float(batch_meta[key])
    out["num_samples"] = float(len(items))
    out["effective_rollouts"] = float(_rollout_count(items))
    per_rollout = {
        it.meta.get("rollout_id", f"item{i}"): it.meta["total_reward"]
        for i, it in enumerate(items)
        if isinstance(it.meta.get("total_reward"), (int, float))
    }
    rewards = list(per_rollout.values())  # one value per rollout, not per step
    if rewards:
        out["avg_total_reward"] = sum(rewards) / len(rewards)
    elif isinstance(batch_meta.get("avg_total_reward"), (int, float)):
        out["avg_total_reward"] = float(batch_meta["avg_total_reward"])
    lengths = [it.num_action_tokens for it in items]
    if lengths:
        out["avg_completion_length"] = sum(lengths) / len(lengths)
    return out


def staleness_stats(items: Sequence[SAWItem], trainer_version: int) -> dict[str, float]:
    """How far behind the trainer the sampled items are: ``trainer_version - meta["policy_version"]``.

    ``staleness_mean``/``staleness_max`` over the items that carry a version (none: no stats).
    """
    lags = [
        trainer_version - it.meta["policy_version"]
        for it in items
        if isinstance(it.meta.get("policy_version"), int) and not isinstance(it.meta["policy_version"], bool)
    ]
    if not lags:
        return {}
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags))}
