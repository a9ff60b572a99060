"""Token-budget micro-batching: truncate, sort by length, pack, then collate into padded tensors.

Packing keeps ``max_len_in_batch * count <= micro_token_budget`` so every micro-batch costs about the
same memory however the lengths spread, and sorting first keeps the padding small (migration guide,
"Token-Budget Micro-Batching").
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ludic.training.layout import token_arrays as ta
from ludic.training.shapes import Float, Int, shape_checked
from ludic.training.types import ActorTokenLogps, SAWItem, check_token_weights


def _where(item: SAWItem, index: int) -> str:
    return (
        f"item {index} (rollout_id={item.meta.get('rollout_id')!r}, "
        f"step_index={item.meta.get('step_index')!r})"
    )


def truncate_item(item: SAWItem, max_seq_len: int) -> SAWItem:
    """A copy of ``item`` cut to its first ``max_seq_len`` tokens, with truncation recorded in meta.

    The actor's logprobs and any per-token weights are trimmed to the action tokens that survive,
    so they stay aligned.
    Items that fit get the same meta keys (``seq_len_truncated=False``) so reducers see every item.
    """
    n = ta.num_tokens(item)
    keep = min(n, max_seq_len)
    meta = {
        **item.meta,
        "seq_len_truncated": n > max_seq_len,
        "seq_len_original": n,
        "seq_len_retained": keep,
        "seq_len_retained_frac": keep / n,
    }
    if n <= max_seq_len:
        return ta.with_meta(item, meta)  # a popped item's arrays stay packed
    action_mask = list(item.action_mask[:keep])
    attachments = item.attachments
    n_action = int(sum(action_mask))
    if attachments.actor_logps is not None:
        kept_logps = list(attachments.actor_logps.token_logps[:n_action])
        attachments = replace(attachments, actor_logps=ActorTokenLogps(token_logps=kept_logps))
    if attachments.frozen_logps:
        frozen = {key: list(values[:n_action]) for key, values in attachments.frozen_logps.items()}
        attachments = replace(attachments, frozen_logps=frozen)
    return SAWItem(
        input_ids=list(item.input_ids[:keep]),
        attention_mask=list(item.attention_mask[:keep]),
        action_mask=action_mask,
        weight=item.weight,
        meta=meta,
        attachments=attachments,
        token_weights=None if item.token_weights is None else list(item.token_weights[:n_action]),
    )


def split_items_by_token_budget(
    items: list[SAWItem], *, micro_token_budget: int, max_seq_len: int
) -> list[list[SAWItem]]:
    """Truncate to ``max_seq_len``, sort shortest first, and pack greedily under the token budget.

    A micro-batch is closed as soon as adding the next (longer or equal) item would make
    ``max_len_in_batch * count`` exceed ``micro_token_budget``.
    """
    for name, value in (("micro_token_budget", micro_token_budget), ("max_seq_len", max_seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if micro_token_budget < max_seq_len:
        raise ValueError(
            f"micro_token_budget ({micro_token_budget}) < max_seq_len ({max_seq_len}): a full-length "
            "sequence would not fit in any micro-batch; raise micro_token_budget or lower max_seq_len"
        )
    if not items:
        raise ValueError("split_items_by_token_budget got an empty list of items; nothing to train on")
    truncated = [truncate_item(it, max_seq_len) for it in items]
    _refuse_if_every_action_was_cut(items, truncated, max_seq_len)
    ordered = sorted(truncated, key=ta.num_tokens)  # stable: ties keep input order
    batches: list[list[SAWItem]] = []
    current: list[SAWItem] = []
    for item in ordered:
        length = ta.num_tokens(item)  # >= every length already in `current` (sorted)
        if current and length * (len(current) + 1) > micro_token_budget:
            batches.append(current)
            current = []
        current.append(item)
    batches.append(current)
    return batches


def _refuse_if_every_action_was_cut(items: list[SAWItem], truncated: list[SAWItem], max_seq_len: int) -> None:
    """A batch whose action tokens all fell past ``max_seq_len`` would train on nothing, silently."""
    if any(ta.num_action_tokens(it) for it in truncated) or not any(ta.num_action_tokens(it) for it in items):
        return
    first_action = min(list(it.action_mask).index(1) for it in items if any(it.action_mask))
    raise ValueError(
        f"max_seq_len={max_seq_len} truncates away every action token of all {len(items)} items in this "
        f"batch (the earliest action starts at token {first_action}): nothing would be learned; raise "
        "TrainerConfig.max_seq_len (trainer.max_seq_len in a run config) above the prompt length"
    )


def _validate_for_collate(item: SAWItem, index: int) -> None:
    where = _where(item, index)
    n = ta.num_tokens(item)
    for name in ("attention_mask", "action_mask"):
        m = len(ta.values(item, name))
        if m != n:
            raise ValueError(f"{where}: {name} has {m} entries, input_ids {n}")
    if not isinstance(item.weight, (int, float)) or not math.isfinite(item.weight):
        raise ValueError(f"{where}: weight must be a finite number, got {item.weight!r}")
    actor, n_action = ta.actor_logps(item), ta.num_action_tokens(item)
    if actor is not None and len(actor) != n_action:
        raise ValueError(f"{where}: actor_logps has {len(actor)} entries, action_mask marks {n_action} action tokens")
    weights = ta.values(item, "token_weights")
    if isinstance(weights, np.ndarray):  # packed: checked finite when popped
        if len(weights) != n_action:
            raise ValueError(f"{where}: token_weights has {len(weights)} entries, action_mask marks {n_action} action tokens")
    elif weights is not None:
        check_token_weights(where, weights, n_action)


def collate_saw_items(
    items: list[SAWItem], *, pad_token_id: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch into tensors.

    Keys: ``input_ids``/``attention_mask``/``action_mask`` [B, T] (long), ``weight`` [B] (float32);
    when any item has ``token_weights``, ``token_weight`` [B, T] (float32: each action token's
    weight, an item without them repeating its ``weight``, 0 off the action); and, when every item
    carries actor logprobs, ``old_logp_action`` [B] (their sum over the action) and ``actor_logps``
    [B, T] (each actor logprob at its action position, 0 elsewhere); likewise one [B, T] tensor per
    key of ``attachments.frozen_logps`` (``ref_logps``, ``teacher_logps``).
    """
    if not items:
        raise ValueError("collate_saw_items got an empty list of items")
    for i, item in enumerate(items):
        _validate_for_collate(item, i)
    with_logps = [it.attachments.actor_logps is not None for it in items]
    if any(with_logps) and not all(with_logps):
        missing = next(i for i, has in enumerate(with_logps) if not has)
        raise ValueError(
            f"{_where(items[missing], missing)} has no actor_logps while {sum(with_logps)} of "
            f"{len(items)} items do; mixing them would give a ratio loss wrong old log-probs"
        )
    B, T = len(items), max(ta.num_tokens(it) for it in items)
    ids, attention, action = np.full((B, T), int(pad_token_id), dtype=np.int64), np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
    for i, it in enumerate(items):  # rows filled in numpy from lists, or straight from a popped item's arrays
        row = ta.values(it, "input_ids")
        n = len(row)
        ids[i, :n] = row
        attention[i, :n] = ta.values(it, "attention_mask")
        action[i, :n] = ta.values(it, "action_mask")
    input_ids, attention_mask, action_mask = (torch.from_numpy(x) for x in (ids, attention, action))
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "weight": torch.tensor([float(it.weight) for it in items], dtype=torch.float32),
    }
    if all(with_logps):
        actor_logps = _at_action_positions([ta.actor_logps(it) for it in items], action_mask)
        out["actor_logps"] = actor_logps
        out["old_logp_action"] = actor_logps.sum(dim=1)
    if any(ta.values(it, "token_weights") is not None for it in items):
        per_token = [ta.values(it, "token_weights") for it in items]
        per_token = [
            w if w is not None else [float(it.weight)] * ta.num_action_tokens(it)
            for it, w in zip(items, per_token, strict=True)
        ]
        out["token_weight"] = _at_action_positions(per_token, action_mask)
    for key in _frozen_keys(items):
        out[key] = _at_action_positions([it.attachments.frozen_logps[key] for it in items], action_mask)
    _check_collated(input_ids, attention_mask, action_mask, out["weight"])
    return {k: v.to(device) for k, v in out.items()}


@shape_checked
def _check_collated(
    input_ids: Int[Tensor, "B T"],
    attention_mask: Int[Tensor, "B T"],
    action_mask: Int[Tensor, "B T"],
    weight: Float[Tensor, " B"],
) -> None:
    """The collated batch's shapes, checked with ``LUDIC_CHECK_SHAPES=1`` (a no-op otherwise)."""


@shape_checked
def _at_action_positions(values: list[Any], action_mask: Int[Tensor, "B T"]) -> Float[Tensor, "B T"]:
    """``[B, T]`` float32: row i holds ``values[i]`` (a list or an array) at its action positions, 0 elsewhere."""
    out = np.zeros(tuple(action_mask.shape), dtype=np.float32)
    on_action = action_mask.cpu().numpy() != 0
    for i, row in enumerate(values):
        if len(row) != int(on_action[i].sum()):
            raise ValueError(f"row {i}: {len(row)} values for {int(on_action[i].sum())} action positions")
        out[i][on_action[i]] = row  # float64 -> float32 rounds to nearest, as torch.tensor(row, float32) did
    return torch.from_numpy(out)


def _frozen_keys(items: list[SAWItem]) -> list[str]:
    """Keys of ``attachments.frozen_logps`` (``ref_logps``, ...) that every item has; some-but-not-all raises."""
    keys = sorted({key for it in items for key in it.attachments.frozen_logps})
    for key in keys:
        missing = [i for i, it in enumerate(items) if key not in it.attachments.frozen_logps]
        if missing:
            raise ValueError(
                f"{_where(items[missing[0]], missing[0])} has no frozen_logps[{key!r}] while "
                f"{len(items) - len(missing)} of {len(items)} items do; score every item of the batch"
            )
    return keys
