"""Prompt-prefix sharing: a GRPO group's prompt goes through the model once, not once per completion.

In a group of G completions of one prompt, the plain collated micro-batch runs the prompt's P
tokens G times. Sharing lays each distinct prompt out once followed by the tails of every item
that shares it, with an attention mask that lets each tail see the prompt and itself (causally)
but not its siblings, and position ids that restart after the prompt for every tail::

    row:  [ p0 p1 ... p(s-1) | a_s a_(s+1) ... | b_s b_(s+1) ... | ... ]
    pos:  [ 0  1  ...  s-1   | s   s+1    ...  | s   s+1    ...  | ... ]

Each token attends to exactly the keys it would in its own sequence, at the same positions, so the
logits are those of the plain forward (up to float rounding) and so are the gradients. The
Trainer packs such groups end to end with other sequences (``packing.py``); ``pack_shared_prefix``
here is the one-row-per-prompt layout on its own, for benchmarks and tests.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ludic.training.layout import token_arrays as ta
from ludic.training.layout.packing import (
    PackedBatch,
    PackPlan,
    Segment,
    first_action,
    pack_plan,
    supports_packing,
    view_start,
)
from ludic.training.types import SAWItem

SharedPrefixBatch = PackedBatch
"""The packed layout (kept under its earlier name)."""


def prompt_groups(items: list[SAWItem]) -> list[list[int]]:
    """Indices of items grouped by identical prompt (tokens before the first action token).

    Items with no action token or a non-trivial attention mask cannot share; each is its own group.
    """
    groups: dict[bytes, list[int]] = {}
    alone: list[list[int]] = []
    for i, item in enumerate(items):
        first = first_action(item)
        if first is None or first <= 1 or not ta.all_ones(ta.values(item, "attention_mask")):
            alone.append([i])
            continue
        prompt = np.asarray(ta.values(item, "input_ids")[:first], dtype=np.int64)  # lists and arrays alike
        groups.setdefault(prompt.tobytes(), []).append(i)
    return list(groups.values()) + alone


def pack_shared_prefix(
    items: list[SAWItem],
    *,
    pad_token_id: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    groups: list[list[int]] | None = None,
) -> PackedBatch:
    """Pack ``items`` one row per prompt group (see the module docstring for the layout)."""
    if not items:
        raise ValueError("pack_shared_prefix got an empty list of items")
    groups = groups if groups is not None else prompt_groups(items)
    rows: list[list[Segment]] = []
    for group in groups:
        s = view_start(items[group[0]]) if len(group) > 1 else 0
        length = s + sum(len(items[i].input_ids) - s for i in group)
        rows.append([Segment(tuple(group), s, length)])
    return pack_plan(PackPlan(items=list(items), rows=rows), pad_token_id=pad_token_id, device=device, dtype=dtype)


def forward_shared_prefix_logits(model: nn.Module, batch: PackedBatch) -> Tensor:
    """``[B, Tv, V]`` logits for the items' views, from one forward over the packed rows."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    logits = out.logits if hasattr(out, "logits") else out
    R, L, V = logits.shape
    return logits.reshape(R * L, V)[batch.gather_index]


def supports_shared_prefix(model: nn.Module) -> bool:
    """True for models whose packed forward is tested equal to the plain one (``supports_packing``)."""
    return supports_packing(model)
