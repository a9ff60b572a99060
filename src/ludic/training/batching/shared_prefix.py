"""Prompt-prefix sharing: a GRPO group's prompt goes through the model once, not once per completion.

In a group of G completions of one prompt, the plain collated micro-batch runs the prompt's P
tokens G times. Here each distinct prompt is packed once into a row followed by the tails of every
item that shares it, with an attention mask that lets each tail see the prompt and itself (causally)
but not its siblings, and position ids that restart after the prompt for every tail::

    row:  [ p0 p1 ... p(s-1) | a_s a_(s+1) ... | b_s b_(s+1) ... | ... ]
    pos:  [ 0  1  ...  s-1   | s   s+1    ...  | s   s+1    ...  | ... ]

Each token attends to exactly the keys it would in its own sequence, at the same positions, so the
logits are those of the plain forward (up to float rounding) and so are the gradients.

The loss then sees each item's *view*: its tokens from ``s = P - 1`` (the last prompt token, whose
logits score the first action token) to the end. Every action token is scored inside the view, so
the per-sequence losses, and their gradients, do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ludic.training.batching.micro_batching import collate_saw_items
from ludic.training.types import SAWItem

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
"""HF attention kernels that honour an arbitrary 4D additive mask (flash-attention kernels do not)."""

MAX_COST_RATIO = 0.5
"""Share only when the packed rows run at most this fraction of the plain padded positions.

Why not any saving: a packed row is long (prompt + all of its group's tails) and its dense mask
keeps sdpa off the flash kernel. On an H100 (bf16, 200M params) a layout at 0.29x the positions
ran 1.56x faster, but one at 0.52x (short prompt, 512-token replies) ran 0.66x as fast
(``bench/bench_shared_prefix.py``).
"""


@dataclass
class SharedPrefixBatch:
    """A micro-batch packed for prefix sharing.

    ``packed_*`` are the model inputs ([R, L] ids and positions, [R, 1, L, L] additive mask);
    ``gather_index`` [B, Tv] picks, for each item's view position, its flat index into the R * L
    packed positions; ``view`` is ``collate_saw_items`` of the items' views, aligned with the
    gathered logits.
    """

    packed_input_ids: Tensor
    packed_position_ids: Tensor
    packed_attention_mask: Tensor
    gather_index: Tensor
    view: dict[str, Tensor]
    real_tokens: int
    """Tokens of the original items (what a plain forward would cover without padding)."""

    @property
    def computed_tokens(self) -> int:
        return int(self.packed_input_ids.numel())


def prompt_groups(items: list[SAWItem]) -> list[list[int]]:
    """Indices of items grouped by identical prompt (tokens before the first action token).

    Items with no action token or a non-trivial attention mask cannot share; each is its own group.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    alone: list[list[int]] = []
    for i, item in enumerate(items):
        first = _first_action(item)
        if first is None or first == 0 or not all(item.attention_mask):
            alone.append([i])
            continue
        groups.setdefault(tuple(item.input_ids[:first]), []).append(i)
    return list(groups.values()) + alone


def plain_padded_tokens(items: list[SAWItem]) -> int:
    """Positions a plain right-padded collate of ``items`` runs: B * max length."""
    return len(items) * max(len(it.input_ids) for it in items)


def shared_layout_tokens(items: list[SAWItem], groups: list[list[int]]) -> int:
    """Positions the packed layout runs: rows * longest row."""
    return len(groups) * max(_row_length(items, g) for g in groups)


def worth_sharing(items: list[SAWItem], groups: list[list[int]]) -> bool:
    """True when some prompt is shared and the packed layout runs <= MAX_COST_RATIO of the positions."""
    if len(groups) == len(items):
        return False
    return shared_layout_tokens(items, groups) <= MAX_COST_RATIO * plain_padded_tokens(items)


def pack_shared_prefix(
    items: list[SAWItem],
    *,
    pad_token_id: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    groups: list[list[int]] | None = None,
) -> SharedPrefixBatch:
    """Pack ``items`` one row per prompt group (see the module docstring for the layout)."""
    if not items:
        raise ValueError("pack_shared_prefix got an empty list of items")
    groups = groups if groups is not None else prompt_groups(items)
    starts = [0] * len(items)
    for group in groups:
        s = _view_start(items[group[0]])
        for i in group:
            starts[i] = s
    views = [_view(item, s) for item, s in zip(items, starts, strict=True)]
    view = collate_saw_items(views, pad_token_id=pad_token_id, device=device)

    R, L = len(groups), max(_row_length(items, g) for g in groups)
    ids = torch.full((R, L), int(pad_token_id), dtype=torch.long)
    positions = torch.zeros((R, L), dtype=torch.long)
    allowed = torch.zeros((R, L, L), dtype=torch.bool)
    B, Tv = view["input_ids"].shape
    gather = torch.zeros((B, Tv), dtype=torch.long)
    for r, group in enumerate(groups):
        s = starts[group[0]]
        prefix = items[group[0]].input_ids[:s]
        ids[r, :s] = torch.tensor(prefix, dtype=torch.long)
        positions[r, :s] = torch.arange(s)
        allowed[r, :s, :s] = torch.ones(s, s, dtype=torch.bool).tril()
        col = s
        for i in group:
            tail = items[i].input_ids[s:]
            n = len(tail)
            ids[r, col : col + n] = torch.tensor(tail, dtype=torch.long)
            positions[r, col : col + n] = torch.arange(s, s + n)
            allowed[r, col : col + n, :s] = True  # every tail token sees the whole shared prefix
            allowed[r, col : col + n, col : col + n] = torch.ones(n, n, dtype=torch.bool).tril()
            gather[i, :n] = r * L + torch.arange(col, col + n)
            col += n
        pad = torch.arange(col, L)
        allowed[r, pad, pad] = True  # padding attends to itself only: finite logits, no NaN gradients
    mask = torch.zeros((R, 1, L, L), dtype=dtype)
    mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    return SharedPrefixBatch(
        packed_input_ids=ids.to(device),
        packed_position_ids=positions.to(device),
        packed_attention_mask=mask.to(device),
        gather_index=gather.to(device),
        view=view,
        real_tokens=sum(len(it.input_ids) for it in items),
    )


def forward_shared_prefix_logits(model: nn.Module, batch: SharedPrefixBatch) -> Tensor:
    """``[B, Tv, V]`` logits for the items' views, from one forward over the packed rows."""
    out = model(
        input_ids=batch.packed_input_ids,
        attention_mask=batch.packed_attention_mask,
        position_ids=batch.packed_position_ids,
        use_cache=False,
    )
    logits = out.logits if hasattr(out, "logits") else out
    R, L, V = logits.shape
    return logits.reshape(R * L, V)[batch.gather_index]


def supports_shared_prefix(model: nn.Module) -> bool:
    """True for HF models whose attention kernel honours a custom 4D mask."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in ATTENTION_IMPLEMENTATIONS


def _first_action(item: SAWItem) -> int | None:
    for t, flag in enumerate(item.action_mask):
        if flag:
            return t
    return None


def _view_start(item: SAWItem) -> int:
    """Where an item's view begins: its last prompt token (0 for items that cannot share)."""
    first = _first_action(item)
    return 0 if first is None or not all(item.attention_mask) else max(first - 1, 0)


def _view(item: SAWItem, start: int) -> SAWItem:
    if start == 0:
        return item
    return replace(
        item,
        input_ids=item.input_ids[start:],
        attention_mask=item.attention_mask[start:],
        action_mask=item.action_mask[start:],
    )


def _row_length(items: list[SAWItem], group: list[int]) -> int:
    s = _view_start(items[group[0]])
    return s + sum(len(items[i].input_ids) - s for i in group)
