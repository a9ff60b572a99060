"""Popped items reach the trainer's tensors from their packed arrays: the same tensors as from lists, no list built."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.layout import token_arrays as ta
from ludic.training.layout.forward import micro_batch_loss, plan_micro_batches
from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.layout.packing import pack_plan, plan_packed_micro_batches
from ludic.training.layout.shared_prefix import prompt_groups
from ludic.training.pipeline.codec import decode_entry, encode_item
from ludic.training.presets import make_grpo
from ludic.training.types import SAWItem

LISTS = ("_list_input_ids", "_list_attention_mask", "_list_action_mask", "_list_token_weights")


def _items(seed: int = 0, *, token_weights: bool = False, frozen: bool = False) -> list[SAWItem]:
    """GRPO-like items: 3 prompts x 3 replies of different lengths, float64 log-probs (rounded on the wire)."""
    rng = random.Random(seed)
    items = []
    for g in range(3):
        prompt = [rng.randrange(2, 64) for _ in range(4 + 3 * g)]
        for _ in range(3):
            reply = [rng.randrange(2, 64) for _ in range(rng.randrange(1, 10))]
            item = prompt_completion_item(
                prompt, reply, weight=rng.uniform(-1, 1), actor_logps=[rng.uniform(-4, -0.5) for _ in reply],
                meta={"policy_version": 0, "rollout_id": f"r{len(items)}"},
            )  # fmt: skip
            if token_weights:
                item.token_weights = [rng.uniform(-1, 1) for _ in reply]
            if frozen:
                item.attachments.frozen_logps["ref_logps"] = [rng.uniform(-4, -0.5) for _ in reply]
            items.append(item)
    return items


def _popped(items: list[SAWItem]) -> list[SAWItem]:
    out = []
    for i, it in enumerate(items):
        fields = {k.encode(): v for k, v in encode_item(it, run_id="r", item_id=f"x{i}").items()}
        out.append(decode_entry(fields, run_id="r").item)
    return out


def _no_lists_built(items: list[SAWItem]) -> bool:
    """No per-token list on any item (``_list_token_weights`` is None where an item has no token weights)."""
    return not any(it.__dict__.get(key) is not None for it in items for key in LISTS) and not any(
        "_list_token_logps" in it.attachments.actor_logps.__dict__ for it in items
    )


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("extra", [{}, {"token_weights": True}, {"frozen": True}])
def test_collating_popped_arrays_gives_the_tensors_collating_lists_gives(extra):
    items = _items(**extra)
    popped = _popped(items)
    from_arrays = collate_saw_items(popped, pad_token_id=0, device="cpu")
    assert _no_lists_built(popped)
    _assert_same(from_arrays, collate_saw_items(items, pad_token_id=0, device="cpu"))
    assert "actor_logps" in from_arrays and ("token_weight" in from_arrays) == bool(extra.get("token_weights"))


def test_planning_and_packing_popped_items_gives_the_same_rows_without_building_lists():
    items = _items(seed=1)
    popped = _popped(items)
    assert [len(g) for g in prompt_groups(popped)] == [len(g) for g in prompt_groups(items)] == [3, 3, 3]
    batches = split_items_by_token_budget(popped, micro_token_budget=64, max_seq_len=32)
    expected = split_items_by_token_budget(items, micro_token_budget=64, max_seq_len=32)
    assert [[it.meta["rollout_id"] for it in mb] for mb in batches] == [[it.meta["rollout_id"] for it in mb] for mb in expected]
    plans = [plan_packed_micro_batches(x, prompt_groups(x), micro_token_budget=64) for x in (popped, items)]
    for got, want in zip(*plans, strict=True):
        a, b = (pack_plan(p, pad_token_id=0, device="cpu") for p in (got, want))
        for name in ("input_ids", "position_ids", "attention_mask", "gather_index"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        _assert_same(a.view, b.view)
        assert a.real_tokens == b.real_tokens
    assert _no_lists_built(popped) and _no_lists_built([it for mb in batches for it in mb])


@pytest.mark.parametrize("pack", [False, True])
def test_a_training_forward_on_popped_items_equals_the_lists_one(pack):
    """The trainer's path (plan, pack or pad, collate, loss) on popped items: same loss, no list built."""
    items, popped = _items(seed=2), None
    popped = _popped(items)
    losses = []
    for batch in (popped, items):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))  # fmt: skip
        mbs = plan_micro_batches(model, batch, micro_token_budget=64, max_seq_len=32, pack=pack)
        assert all((mb.plan is not None) == pack for mb in mbs)
        loss_fn = make_grpo(group_size=3).loss
        losses.append([micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=torch.device("cpu"))[0] for mb in mbs])
        assert sum(ta.attended_tokens(it) for mb in mbs for it in mb.items) == sum(len(it.input_ids) for it in items)
        if batch is popped:
            assert _no_lists_built([it for mb in mbs for it in mb.items]) and _no_lists_built(popped)
    assert torch.equal(torch.stack(losses[0]), torch.stack(losses[1]))


def test_a_list_assigned_to_a_popped_item_is_what_collation_reads():
    item = _popped(_items())[0]
    n = item.num_tokens
    item.action_mask = [0] * (n - 1) + [1]
    item.attachments.actor_logps.token_logps = [-1.5]
    assert ta.values(item, "action_mask") is item.action_mask and item.num_action_tokens == 1
    batch = collate_saw_items([item], pad_token_id=0, device="cpu")
    assert batch["action_mask"][0].tolist() == item.action_mask and batch["actor_logps"][0, -1] == -1.5
    assert isinstance(ta.values(item, "input_ids"), np.ndarray)  # the others still read packed


def test_a_popped_item_with_a_wrong_token_weight_count_is_refused_at_collation():
    item = _popped(_items(token_weights=True))[0]
    item.__dict__["_arrays"]["token_weights"] = np.zeros(item.num_action_tokens + 1)
    with pytest.raises(ValueError, match="token_weights has"):
        collate_saw_items([item], pad_token_id=0, device="cpu")
