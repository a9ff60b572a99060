"""Planning packed micro-batches: which sequences share a row, and how long rows are.

A *segment* is a prompt group (items with the same prompt, when sharing) laid out as the prompt once
followed by every item's tail, or one item on its own. Segments are balanced into rows (LPT, longest
first to the least-filled row) and rows into micro-batches under the token budget; the row capacity and
whether prompts are shared are chosen by an estimate of the compute (``plan_cost``). ``packing.py``
turns a plan into model inputs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

from ludic.training.layout import token_arrays as ta
from ludic.training.layout.attention_blocks import block_pairs
from ludic.training.types import SAWItem

ATTENTION_WEIGHT = 1 / (6 * 128)
"""Default cost of one attention position pair relative to one token through the linear layers.

Per layer a token costs about ``26 h^2`` FLOPs in the linear layers (q/k/v/o and a 3h MLP) and
``4 L h`` in attention against a row of L keys, so a row of L positions costs about
``L * (1 + L / (6.5 h))`` token-equivalents. With sdpa/eager the block mask is dense: attention runs
over the whole row whatever the blocks, so longer rows pay quadratically. ``training.layout.micro_batch_plan``
passes ``1 / (6 h)`` for the model's hidden size h (on a 0.8M Qwen2 on the CPU this predicted the
measured attention share within 10%).
"""

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
