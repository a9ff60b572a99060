"""Per-token data read as arrays where an item keeps them packed, so no Python list is built for them.

A ``SAWItem``'s per-token fields are lists. A ``PackedSAWItem`` (popped from the pipeline stream) keeps
them as checked numpy arrays and builds a list only when one is read. The trainer's path (micro-batch
planning, packing, collation, token counts) reads them through these helpers, which give the array
where there is one and the list otherwise: a popped item reaches the tensors without one Python
object per token, and any other item is read exactly as before. An item opts in by having
``packed(name) -> np.ndarray | None`` (None: read the field).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ludic.training.types import SAWItem


def values(item: Any, name: str) -> Any:
    """``item.<name>`` (``input_ids``, ``attention_mask``, ``action_mask``, ``token_weights``; on
    ``attachments.actor_logps``: ``token_logps``) as its packed array when it has one, else the field."""
    packed = getattr(item, "packed", None)
    array = packed(name) if packed is not None else None
    return array if array is not None else getattr(item, name)


def actor_logps(item: SAWItem) -> Any:
    """The actor's per-action-token log-probs (array or list), or None."""
    actor = item.attachments.actor_logps
    return None if actor is None else values(actor, "token_logps")


def num_tokens(item: SAWItem) -> int:
    return len(values(item, "input_ids"))


def num_action_tokens(item: SAWItem) -> int:
    mask = values(item, "action_mask")
    return int(np.count_nonzero(mask)) if isinstance(mask, np.ndarray) else int(sum(mask))


def attended_tokens(item: SAWItem) -> int:
    """How many tokens the attention mask keeps (the item's real tokens)."""
    mask = values(item, "attention_mask")
    return int(np.count_nonzero(mask)) if isinstance(mask, np.ndarray) else int(sum(mask))


def all_ones(seq: Sequence[Any]) -> bool:
    return bool(seq.all()) if isinstance(seq, np.ndarray) else all(seq)


def first_one(seq: Sequence[Any]) -> int | None:
    """Index of the first non-zero entry, or None."""
    if isinstance(seq, np.ndarray):
        hits = np.flatnonzero(seq)
        return int(hits[0]) if hits.size else None
    for t, flag in enumerate(seq):
        if flag:
            return t
    return None


def with_meta(item: SAWItem, meta: dict[str, Any]) -> SAWItem:
    """A copy of ``item`` with ``meta`` replaced (packed arrays stay packed)."""
    copy = getattr(item, "with_meta", None)
    return copy(meta) if copy is not None else replace(item, meta=meta)


def view_from(item: SAWItem, start: int) -> SAWItem:
    """The item without its first ``start`` tokens (packing's views; action-aligned data unchanged)."""
    if start == 0:
        return item
    view = getattr(item, "view_from", None)
    if view is not None:
        return view(start)
    return replace(
        item,
        input_ids=item.input_ids[start:],
        attention_mask=item.attention_mask[start:],
        action_mask=item.action_mask[start:],
    )
