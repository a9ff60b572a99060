"""Padding-free packing: a micro-batch's sequences end to end in rows, each attending only to itself.

A *segment* is a prompt group (items with the same prompt, when sharing) laid out as the prompt
once followed by every item's tail, or one item on its own. Segments go end to end into rows,
with position ids that restart for every sequence and an attention mask that is block-diagonal
over segments (and, inside a shared segment, lets each tail see the prompt and itself only)::

    row: [ p0 .. p(s-1) | a_s a_(s+1) .. | b_s .. | x0 x1 x2 .. | q0 .. | c_s .. | pad ]
    pos: [ 0  ..  s-1   | s   s+1     .. | s   .. | 0  1  2  .. | 0  .. | s   .. | 0   ]

Each token sees exactly the keys it would see in its own right-padded row, at the same positions,
so logits and gradients are those of the plain forward (up to float rounding; tests).

Which sequences share a row and how long rows are is planned in ``pack_planner.py``; this module
turns a plan into model inputs. Rows are balanced, not filled first-fit: for ``R >= ceil(total / capacity)`` rows the segments go,
longest first, to the least-filled row (LPT), so rows end up nearly equal and the padding after
them is a few tokens. The row capacity, and whether prompts are shared, is chosen by an estimate
of the compute (``plan_cost``: positions, plus attention over each row's dense mask), so sharing
a prompt never costs more than not sharing it, and needs no on/off threshold.

The loss sees each item's *view*: its tokens from ``s`` (the last prompt token for items with an
action, whose logits score the first action token) to the end, gathered from the packed rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ludic.training.layout import token_arrays as ta
from ludic.training.layout.attention_blocks import (
    AttentionBlocks,
    Block,
    build_attention_blocks,
)
from ludic.training.layout.micro_batching import collate_saw_items, truncate_item
from ludic.training.layout.pack_planner import (  # noqa: F401 (the planner's names, as imported from here)
    ATTENTION_WEIGHT,
    PackPlan,
    Segment,
    balance_rows,
    can_pack,
    first_action,
    make_segments,
    plan_cost,
    plan_packed_micro_batches,
    view_start,
)
from ludic.training.types import SAWItem

PACKABLE_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})
"""HF ``model_type``s whose packed forward (4D block mask + restarting position ids) is tested equal
to the plain forward (``tests/training/layout/test_packing.py``), and whose logits are exactly
``lm_head(decoder(...))`` (no soft-capping or scaling). Others fall back to padded rows."""

MASK_ATTENTION = ("sdpa", "eager")
"""HF attention kernels that honour an arbitrary 4D additive mask (flash-attention kernels do not)."""


def supports_packing(model: nn.Module, longest: int = 0) -> bool:
    """True for tested architectures with a mask-honouring kernel and no sliding window shorter
    than ``longest`` (a 4D mask replaces the model's own, window included)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PACKABLE_MODEL_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) not in MASK_ATTENTION:
        return False
    window = getattr(config, "sliding_window", None)
    return window is None or window >= longest


@dataclass
class PackedBatch:
    """Model inputs for packed rows and how to read each item's view back out of them.

    ``input_ids``/``position_ids`` [R, L]; ``attention_mask`` [R, 1, L, L] additive (0 where a query
    may attend, dtype-min elsewhere), or None when the rows were packed for block attention
    (``blocks``, see ``attention_blocks.py``); ``gather_index`` [B, Tv]: for each item's view position,
    its flat index into the ``R * L`` packed positions; ``view``: ``collate_saw_items`` of the views.
    """

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor | None
    gather_index: Tensor
    view: dict[str, Tensor]
    real_tokens: int
    """Tokens of the original items (what a plain forward covers without padding)."""
    blocks: AttentionBlocks | None = None

    @property
    def computed_tokens(self) -> int:
        return int(self.input_ids.numel())


def truncated(items: list[SAWItem], max_seq_len: int) -> list[SAWItem]:
    return [truncate_item(it, max_seq_len) for it in items]


def pack_plan(
    plan: PackPlan,
    *,
    pad_token_id: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
    dense_mask: bool = True,
) -> PackedBatch:
    """Build the packed rows, the view gather index and either the 4D block mask (``dense_mask``) or
    the attention blocks (``segment_attention.py``) for one micro-batch."""
    items = plan.items
    starts = [0] * len(items)
    for row in plan.rows:
        for seg in row:
            for i in seg.members:
                starts[i] = seg.start if len(seg.members) > 1 else view_start(items[i])
    views = [_view(item, s) for item, s in zip(items, starts, strict=True)]
    view = collate_saw_items(views, pad_token_id=pad_token_id, device=device)
    R, L = len(plan.rows), plan.row_length
    ids = torch.full((R, L), int(pad_token_id), dtype=torch.long)
    positions = torch.zeros((R, L), dtype=torch.long)
    allowed = torch.zeros((R, L, L), dtype=torch.bool) if dense_mask else None
    blocks: list[Block] = []
    B, Tv = view["input_ids"].shape
    gather = torch.zeros((B, Tv), dtype=torch.long)
    for r, row in enumerate(plan.rows):
        col = 0
        for seg in row:
            col = _place_segment(items, seg, starts, r, col, L, ids, positions, allowed, blocks, gather)
        if allowed is not None:
            pad = torch.arange(col, L)
            allowed[r, pad, pad] = True  # padding attends to itself only: finite logits, no NaN gradients
    mask = None
    if allowed is not None:
        mask = torch.zeros((R, 1, L, L), dtype=dtype)
        mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
        mask = mask.to(device)
    return PackedBatch(
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        attention_mask=mask,
        gather_index=gather.to(device),
        view=view,
        real_tokens=sum(ta.num_tokens(it) for it in items),
        blocks=None if dense_mask else build_attention_blocks(blocks, R, L).to(device),
    )


def _place_segment(
    items: list[SAWItem], seg: Segment, starts: list[int], r: int, col: int, L: int,
    ids: Tensor, positions: Tensor, allowed: Tensor | None, blocks: list[Block], gather: Tensor,
) -> int:  # fmt: skip
    """Write one segment into row ``r`` from column ``col`` (its mask into ``allowed``, or its attention
    blocks onto ``blocks``); returns the column after it."""
    s, base = seg.start, col
    if s:
        ids[r, col : col + s] = torch.tensor(ta.values(items[seg.members[0]], "input_ids")[:s], dtype=torch.long)
        positions[r, col : col + s] = torch.arange(s)
        if allowed is not None:
            allowed[r, col : col + s, col : col + s] = torch.ones(s, s, dtype=torch.bool).tril()
        blocks.append(Block(r * L + col, s))
        col += s
    for i in seg.members:
        tail = ta.values(items[i], "input_ids")[s:]
        n = len(tail)
        ids[r, col : col + n] = torch.tensor(tail, dtype=torch.long)
        positions[r, col : col + n] = torch.arange(s, s + n)
        if allowed is not None:
            allowed[r, col : col + n, base : base + s] = True  # every tail sees the whole shared prefix
            allowed[r, col : col + n, col : col + n] = torch.ones(n, n, dtype=torch.bool).tril()
        blocks.append(Block(r * L + col, n, r * L + base, s))  # s == 0: a lone sequence, causal alone
        v = starts[i] - s  # where the item's view begins inside its tail
        gather[i, : n - v] = r * L + torch.arange(col + v, col + n)
        col += n
    return col


def _view(item: SAWItem, start: int) -> SAWItem:
    return ta.view_from(item, start)
