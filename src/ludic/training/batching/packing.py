"""Padding-free packing: a micro-batch's sequences end to end in rows, each attending only to itself.

A *segment* is a prompt group (items with the same prompt, when sharing) laid out as the prompt
once followed by every item's tail, or one item on its own. Segments go end to end into rows,
with position ids that restart for every sequence and an attention mask that is block-diagonal
over segments (and, inside a shared segment, lets each tail see the prompt and itself only)::

    row: [ p0 .. p(s-1) | a_s a_(s+1) .. | b_s .. | x0 x1 x2 .. | q0 .. | c_s .. | pad ]
    pos: [ 0  ..  s-1   | s   s+1     .. | s   .. | 0  1  2  .. | 0  .. | s   .. | 0   ]

Each token sees exactly the keys it would see in its own right-padded row, at the same positions,
so logits and gradients are those of the plain forward (up to float rounding; tests).

Rows are balanced, not filled first-fit: for ``R >= ceil(total / capacity)`` rows the segments go,
longest first, to the least-filled row (LPT), so rows end up nearly equal and the padding after
them is a few tokens. The row capacity, and whether prompts are shared, is chosen by an estimate
of the compute (``plan_cost``: positions, plus attention over each row's dense mask), so sharing
a prompt never costs more than not sharing it, and needs no on/off threshold.

The loss sees each item's *view*: its tokens from ``s`` (the last prompt token for items with an
action, whose logits score the first action token) to the end, gathered from the packed rows.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ludic.training.batching import token_arrays as ta
from ludic.training.batching.attention_blocks import (
    AttentionBlocks,
    Block,
    block_pairs,
    build_attention_blocks,
)
from ludic.training.batching.micro_batching import collate_saw_items, truncate_item
from ludic.training.types import SAWItem

ATTENTION_WEIGHT = 1 / (6 * 128)
"""Default cost of one attention position pair relative to one token through the linear layers.

Per layer a token costs about ``26 h^2`` FLOPs in the linear layers (q/k/v/o and a 3h MLP) and
``4 L h`` in attention against a row of L keys, so a row of L positions costs about
``L * (1 + L / (6.5 h))`` token-equivalents. With sdpa/eager the block mask is dense: attention runs
over the whole row whatever the blocks, so longer rows pay quadratically. ``training.forward``
passes ``1 / (6 h)`` for the model's hidden size h (on a 0.8M Qwen2 on the CPU this predicted the
measured attention share within 10%).
"""

PACKABLE_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})
"""HF ``model_type``s whose packed forward (4D block mask + restarting position ids) is tested equal
to the plain forward (``tests/training/batching/test_packing.py``), and whose logits are exactly
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


@dataclass(frozen=True)
class Segment:
    """Items ``members`` (indices into the plan's items) sharing their first ``start`` tokens."""

    members: tuple[int, ...]
    start: int
    length: int


@dataclass
class PackPlan:
    """One micro-batch: its items and which segments go in which row."""

    items: list[SAWItem]
    rows: list[list[Segment]]

    @property
    def row_length(self) -> int:
        return max(sum(seg.length for seg in row) for row in self.rows)


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


def first_action(item: SAWItem) -> int | None:
    return ta.first_one(ta.values(item, "action_mask"))


def view_start(item: SAWItem) -> int:
    """Where an item's view begins: its last prompt token (0 without an action token)."""
    first = first_action(item)
    return 0 if first is None else max(first - 1, 0)


def can_pack(items: list[SAWItem]) -> bool:
    """Packing needs every item's attention mask to be all ones (no holes to carry into the rows)."""
    return all(ta.all_ones(ta.values(it, "attention_mask")) for it in items)


def make_segments(items: list[SAWItem], groups: list[list[int]], capacity: int) -> list[Segment]:
    """One segment per group, split so that none is longer than ``capacity`` positions."""
    segments: list[Segment] = []
    for group in groups:
        s = view_start(items[group[0]]) if len(group) > 1 else 0
        members: list[int] = []
        length = s
        for i in group:
            tail = ta.num_tokens(items[i]) - s
            if members and length + tail > capacity:
                segments.append(_segment(members, s, length))
                members, length = [], s
            members.append(i)
            length += tail
        segments.append(_segment(members, s, length))
    return segments


def _segment(members: list[int], start: int, length: int) -> Segment:
    if len(members) == 1:  # a lone item needs no shared prefix: its whole sequence is one block
        return Segment((members[0],), 0, length)
    return Segment(tuple(members), start, length)


def balance_rows(segments: list[Segment], capacity: int) -> list[list[Segment]]:
    """Rows of at most ``capacity`` positions, balanced by LPT (longest first, to the least-filled row).

    Tries the fewest rows that could hold the segments and a few more, keeping the layout with
    the fewest positions (rows * longest row).
    """
    total = sum(seg.length for seg in segments)
    ordered = sorted(segments, key=lambda seg: -seg.length)
    best: list[list[Segment]] | None = None
    first = max(1, math.ceil(total / capacity))
    for n_rows in range(first, len(segments) + 1):
        rows: list[list[Segment]] = [[] for _ in range(n_rows)]
        heap = [(0, r) for r in range(n_rows)]
        for seg in ordered:
            fill, r = heapq.heappop(heap)
            rows[r].append(seg)
            heapq.heappush(heap, (fill + seg.length, r))
        longest = max(fill for fill, _ in heap)
        if longest <= capacity and (best is None or n_rows * longest < _positions(best)):
            best = rows
        if best is not None and n_rows >= first + 3:
            break
    assert best is not None  # one segment per row always fits
    return best


def _positions(rows: list[list[Segment]]) -> int:
    return len(rows) * max(sum(seg.length for seg in row) for row in rows)


def plan_cost(plans: list[PackPlan], attention_weight: float = ATTENTION_WEIGHT, *, dense: bool = True) -> float:
    """Estimated compute of a layout in token-equivalents.

    ``dense`` (a 4D mask): sum over micro-batches of R * L * (1 + w L), attention over whole rows.
    Block attention: R * L positions plus w times the blocks' query-key pairs (``block_pairs``).
    """
    if dense:
        return sum(len(p.rows) * p.row_length * (1 + attention_weight * p.row_length) for p in plans)
    return sum(len(p.rows) * p.row_length + attention_weight * _plan_pairs(p) for p in plans)


def _plan_pairs(plan: PackPlan) -> int:
    pairs = 0
    for row in plan.rows:
        for seg in row:
            if len(seg.members) == 1:
                pairs += block_pairs(seg.length)
                continue
            tails = [ta.num_tokens(plan.items[i]) - seg.start for i in seg.members]
            pairs += block_pairs(seg.start) + sum(block_pairs(n, seg.start) for n in tails)
    return pairs


def plan_packed_micro_batches(
    items: list[SAWItem],
    groups: list[list[int]],
    *,
    micro_token_budget: int,
    row_tokens: int | None = None,
    attention_weight: float = ATTENTION_WEIGHT,
    dense_attention: bool = True,
) -> list[PackPlan]:
    """Split ``items`` (already truncated) into micro-batches of balanced rows, ``R * L <= budget``.

    ``groups`` lists item indices that share a prompt. Row capacity is ``max(longest item,
    row_tokens)`` when given; otherwise the cheapest by ``plan_cost`` of 1, 2, 4 and 8 times the
    longest item, with and without the sharing ``groups`` propose: sharing is used exactly when
    it is estimated cheaper, so it never costs more than not sharing and needs no threshold.
    ``dense_attention``: whether attention will run over whole rows (a 4D mask) or by blocks.
    """
    longest = max(ta.num_tokens(it) for it in items)
    ceiling = max(micro_token_budget, longest)
    if row_tokens is not None:
        capacities = [min(max(longest, row_tokens), ceiling)]
    else:
        capacities = sorted({min(longest * k, ceiling) for k in (1, 2, 4, 8)})
    layouts = [groups]
    if any(len(g) > 1 for g in groups):
        layouts.append([[i] for i in range(len(items))])
    candidates = [
        _micro_batches(items, layout, capacity, micro_token_budget)
        for layout in layouts
        for capacity in capacities
    ]
    return min(candidates, key=lambda plans: plan_cost(plans, attention_weight, dense=dense_attention))


def _micro_batches(
    items: list[SAWItem], groups: list[list[int]], capacity: int, micro_token_budget: int
) -> list[PackPlan]:
    rows = balance_rows(make_segments(items, groups, capacity), capacity)
    rows.sort(key=lambda row: -sum(seg.length for seg in row))
    plans: list[PackPlan] = []
    current: list[list[Segment]] = []
    for row in rows:
        longest_row = sum(seg.length for seg in (current[0] if current else row))
        if current and longest_row * (len(current) + 1) > micro_token_budget:
            plans.append(_plan(items, current))
            current = []
        current.append(row)
    plans.append(_plan(items, current))
    return plans


def _plan(items: list[SAWItem], rows: list[list[Segment]]) -> PackPlan:
    """Re-index the rows' segments onto the micro-batch's own item list."""
    order = [i for row in rows for seg in row for i in seg.members]
    local = {i: k for k, i in enumerate(order)}
    new_rows = [
        [replace(seg, members=tuple(local[i] for i in seg.members)) for seg in row] for row in rows
    ]
    return PackPlan(items=[items[i] for i in order], rows=new_rows)


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
