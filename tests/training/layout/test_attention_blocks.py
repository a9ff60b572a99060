"""Attention blocks: every packed position attends to exactly the keys its dense mask allows."""

from __future__ import annotations

import torch
from tests.training.layout.test_packing import group, grpo_items

from ludic.training.layout.attention_blocks import Block, build_attention_blocks
from ludic.training.layout.packing import pack_plan, plan_cost, plan_packed_micro_batches
from ludic.training.layout.shared_prefix import prompt_groups


def allowed_from_blocks(blocks, R: int, L: int) -> torch.Tensor:
    """[R*L, R*L] which key each real query position reads, rebuilt from the buckets."""
    allowed = torch.zeros(R * L, R * L, dtype=torch.bool)
    seen = torch.zeros(R * L, dtype=torch.long)
    for bucket in blocks.buckets:
        b, nq = bucket.query_index.shape
        nk = bucket.key_index.shape[1]
        mask = bucket.mask[:, 0] if bucket.mask is not None else torch.ones(nq, nk, dtype=torch.bool).tril().expand(b, nq, nk)
        real = torch.zeros(b * nq, dtype=torch.bool)
        real[bucket.valid_slots] = True
        for k in range(b):
            for i in range(nq):
                if not real[k * nq + i]:
                    continue
                q = int(bucket.query_index[k, i])
                seen[q] += 1
                allowed[q, bucket.key_index[k][mask[k, i]]] = True
    return allowed, seen


def test_blocks_allow_exactly_what_the_dense_mask_allows():
    items = grpo_items(groups=3, group_size=3, seed=7, max_reply=20)
    plans = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=200, row_tokens=70)
    for plan in plans:
        dense = pack_plan(plan, pad_token_id=0, device="cpu")
        blocked = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=False)
        R, L = dense.input_ids.shape
        assert torch.equal(blocked.input_ids, dense.input_ids) and torch.equal(blocked.gather_index, dense.gather_index)
        allowed, seen = allowed_from_blocks(blocked.blocks, R, L)
        real = seen > 0
        assert seen.max() == 1  # every position is a query of one block only
        want = torch.zeros(R * L, R * L, dtype=torch.bool)
        for r in range(R):
            want[r * L : (r + 1) * L, r * L : (r + 1) * L] = dense.attention_mask[r, 0] == 0
        assert torch.equal(allowed[real], want[real])
        pad = (~real).nonzero().flatten()  # row padding reads the zero row after every real output
        assert (blocked.blocks.output_index[pad] == int(real.sum())).all()


def test_a_grpo_group_costs_a_fraction_of_the_dense_pairs():
    items = group(36, [129] * 8)
    (plan,) = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096, dense_attention=False)
    packed = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=False)
    (row_length,) = {plan.row_length}
    assert row_length == 35 + 8 * 130
    assert row_length**2 / packed.blocks.pairs > 6  # 8 tails x 130 x 165 + 35 x 35 pairs
    assert len(packed.blocks.buckets) == 2  # prompts, tails


def test_unequal_blocks_go_to_buckets_that_waste_little():
    blocks = [Block(0, 100), Block(100, 90), Block(190, 10), Block(200, 8), Block(208, 50, 0, 100)]
    built = build_attention_blocks(blocks, rows=1, row_length=300)
    shapes = sorted(tuple(b.query_index.shape) for b in built.buckets)
    assert shapes == [(1, 50), (2, 10), (2, 100)]
    assert sorted(built.output_index[:258].tolist()) == list(range(258))
    assert (built.output_index[258:] == 258).all()


def test_with_block_attention_sharing_still_never_costs_more():
    for prompt_len, replies in [(40, [4, 6, 8, 5]), (4, [40, 30, 35, 38]), (69, [128] * 8), (3, [1, 1])]:
        items = group(prompt_len, replies) + group(prompt_len + 5, replies)
        shared = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096, dense_attention=False)
        alone = plan_packed_micro_batches(
            items, [[i] for i in range(len(items))], micro_token_budget=4096, dense_attention=False
        )
        assert plan_cost(shared, dense=False) <= plan_cost(alone, dense=False)
