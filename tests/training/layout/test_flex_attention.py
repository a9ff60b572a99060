"""FlexAttention's block mask for packed rows equals the dense mask ``pack_plan`` builds (CPU: forward only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.training.layout.test_packing import build, grpo_items

from ludic.training.layout.flex_attention import (
    FLEX_ATTENTION,
    FLEX_MASK_KWARG,
    block_inputs,
    document_mask_mod,
    flex_attention,
    flex_available,
    packed_block_mask,
    packed_documents,
)
from ludic.training.layout.packing import pack_plan, plan_packed_micro_batches
from ludic.training.layout.shared_prefix import prompt_groups

pytestmark = pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")


def plans(seed: int, share: bool, budget: int) -> list:
    items = grpo_items(seed=seed)
    groups = prompt_groups(items) if share else [[i] for i in range(len(items))]
    return plan_packed_micro_batches(items, groups, micro_token_budget=budget, dense_attention=False)


def flex_allowed(position_ids: torch.Tensor) -> torch.Tensor:
    """[R, L, L] booleans of the mask_mod, evaluated at every (row, query, key)."""
    R, L = position_ids.shape
    mod = document_mask_mod(packed_documents(position_ids))
    b = torch.arange(R)[:, None, None]
    q = torch.arange(L)[None, :, None]
    kv = torch.arange(L)[None, None, :]
    return mod(b, torch.zeros_like(b), q, kv).expand(R, L, L)


def test_documents_of_a_hand_made_row():
    # prompt of 3 (positions 0-2), tails of 2 and 1 (from 3), a lone sequence of 2, one pad
    pos = torch.tensor([[0, 1, 2, 3, 4, 3, 0, 1, 0]])
    docs = packed_documents(pos)
    assert docs.document.tolist() == [[1, 1, 1, 1, 1, 2, 3, 3, 4]]  # the first tail joins its prompt's run
    assert docs.prefix_len.tolist() == [[0, 0, 0, 0, 0, 3, 0, 0, 0]]  # only the second tail has a prefix
    assert docs.prefix_start.tolist()[0][5] == 0  # the second tail reads columns [0, 3)
    allowed = flex_allowed(pos)[0].int()
    assert allowed[5].tolist() == [1, 1, 1, 0, 0, 1, 0, 0, 0]  # the prompt and itself, not tail one
    assert allowed[7].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 0]
    assert allowed[8].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1]  # padding: itself only


@pytest.mark.parametrize(("seed", "share", "budget"), [(0, True, 4096), (1, True, 96), (2, False, 128), (3, True, 64)])
def test_mask_mod_equals_the_dense_mask_of_pack_plan(seed, share, budget):
    for plan in plans(seed, share, budget):
        dense = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=True)
        assert torch.equal(flex_allowed(dense.position_ids), dense.attention_mask[:, 0] == 0)


def test_flex_forward_equals_sdpa_over_the_dense_mask():
    (plan,) = plans(4, True, 4096)[:1]
    dense = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=True)
    R, L = dense.position_ids.shape
    torch.manual_seed(0)
    q, k, v = torch.randn(R, 4, L, 16), torch.randn(R, 2, L, 16), torch.randn(R, 2, L, 16)
    from torch.nn.attention.flex_attention import flex_attention as flex

    out = flex(q, k, v, block_mask=packed_block_mask(dense.position_ids), enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense.attention_mask[:, :, :, :] == 0, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_model_switched_to_flex_gives_the_dense_masks_logits(arch):
    model = build(arch, seed=2)
    (plan,) = plans(5, True, 4096)[:1]
    dense = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=True)
    blocks = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=False)
    inputs = block_inputs(blocks, device="cuda")  # what the CUDA path passes, built on the CPU
    assert FLEX_MASK_KWARG in inputs
    with torch.no_grad():
        ref = model(input_ids=dense.input_ids, position_ids=dense.position_ids, attention_mask=dense.attention_mask)
        with flex_attention(model):
            assert model.config._attn_implementation == FLEX_ATTENTION
            out = model(input_ids=blocks.input_ids, position_ids=blocks.position_ids, **inputs)
    assert model.config._attn_implementation == "sdpa"
    real = blocks.gather_index.unique()  # positions some item reads
    R, L, V = ref.logits.shape
    torch.testing.assert_close(out.logits.reshape(R * L, V)[real], ref.logits.reshape(R * L, V)[real], atol=1e-5, rtol=1e-4)


def test_a_model_switched_to_flex_refuses_a_call_without_the_block_mask():
    model = build("qwen2")
    with flex_attention(model), pytest.raises(ValueError, match=FLEX_MASK_KWARG):
        model(input_ids=torch.tensor([[1, 2, 3]]))
