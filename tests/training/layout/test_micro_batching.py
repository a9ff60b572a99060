import math

import pytest
import torch

from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem


def make_item(n_prompt: int, n_action: int, *, rid: str = "r", logps: bool = False, weight: float = 1.0):
    logp_list = [-0.1 * (i + 1) for i in range(n_action)] if logps else None
    return SAWItem(
        input_ids=[(i % 50) + 1 for i in range(n_prompt + n_action)],
        attention_mask=[1] * (n_prompt + n_action),
        action_mask=[0] * n_prompt + [1] * n_action,
        weight=weight,
        meta={"rollout_id": rid, "step_index": 0},
        attachments=SampleAttachments(ActorTokenLogps(logp_list) if logps else None),
    )


def test_guide_example_packs_sorted_lengths_under_budget():
    items = [make_item(n - 10, 10, rid=str(n)) for n in (300, 100, 400, 200, 150)]
    batches = split_items_by_token_budget(items, micro_token_budget=1024, max_seq_len=400)
    assert [[len(it.input_ids) for it in mb] for mb in batches] == [[100, 150, 200], [300, 400]]


def test_every_micro_batch_respects_max_len_times_count():
    items = [make_item(n - 4, 4) for n in (33, 64, 17, 90, 90, 12, 50, 70)]
    batches = split_items_by_token_budget(items, micro_token_budget=180, max_seq_len=90)
    assert sum(len(mb) for mb in batches) == 8
    for mb in batches:
        assert max(len(it.input_ids) for it in mb) * len(mb) <= 180


def test_budget_below_max_seq_len_is_rejected():
    with pytest.raises(ValueError, match=r"micro_token_budget \(100\) < max_seq_len \(200\)"):
        split_items_by_token_budget([make_item(2, 2)], micro_token_budget=100, max_seq_len=200)


def test_empty_item_list_is_rejected():
    with pytest.raises(ValueError, match="empty"):
        split_items_by_token_budget([], micro_token_budget=100, max_seq_len=10)


def test_truncation_trims_masks_and_actor_logps_and_records_meta():
    item = make_item(3, 5, logps=True)  # 8 tokens, actions at 3..7
    [[cut]] = split_items_by_token_budget([item], micro_token_budget=6, max_seq_len=6)
    assert cut.input_ids == item.input_ids[:6]
    assert cut.action_mask == [0, 0, 0, 1, 1, 1]
    assert cut.attachments.actor_logps.token_logps == pytest.approx([-0.1, -0.2, -0.3])
    assert cut.meta["seq_len_truncated"] is True
    assert cut.meta["seq_len_original"] == 8
    assert cut.meta["seq_len_retained"] == 6
    assert cut.meta["seq_len_retained_frac"] == 0.75
    assert item.meta.get("seq_len_truncated") is None  # the input is not mutated


def test_items_that_fit_are_marked_not_truncated():
    [[kept]] = split_items_by_token_budget([make_item(2, 2)], micro_token_budget=8, max_seq_len=8)
    assert kept.meta["seq_len_truncated"] is False
    assert kept.meta["seq_len_retained_frac"] == 1.0


def test_collate_right_pads_and_places_actor_logps_at_action_positions():
    a = make_item(1, 2, logps=True, weight=0.5)
    a.input_ids = [7, 8, 9]
    short = make_item(1, 1, logps=True)
    short.input_ids = [3, 2]
    out = collate_saw_items([a, short], pad_token_id=0, device="cpu")
    assert out["input_ids"].tolist() == [[7, 8, 9], [3, 2, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["action_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    assert out["weight"].tolist() == [0.5, 1.0]
    expected = torch.tensor([[0.0, -0.1, -0.2], [0.0, -0.1, 0.0]])
    torch.testing.assert_close(out["actor_logps"], expected)
    assert out["old_logp_action"].tolist() == pytest.approx([-0.3, -0.1])


def test_collate_without_actor_logps_omits_ratio_keys():
    out = collate_saw_items([make_item(1, 2)], pad_token_id=0, device="cpu")
    assert set(out) == {"input_ids", "attention_mask", "action_mask", "weight"}
    assert out["input_ids"].dtype == torch.long


def test_collate_rejects_items_where_only_some_have_actor_logps():
    items = [make_item(1, 2, logps=True), make_item(1, 2, rid="bad")]
    with pytest.raises(ValueError, match=r"item 1 \(rollout_id='bad'.*no actor_logps"):
        collate_saw_items(items, pad_token_id=0, device="cpu")


def test_collate_names_item_and_field_for_mismatched_lengths():
    item = make_item(2, 2, rid="x")
    item.action_mask = [0, 1, 1]
    with pytest.raises(ValueError, match=r"rollout_id='x'.*action_mask has 3 entries, input_ids 4"):
        collate_saw_items([item], pad_token_id=0, device="cpu")


def test_collate_rejects_nan_weight_naming_the_item():
    item = make_item(2, 2, rid="nan")
    item.weight = math.nan
    with pytest.raises(ValueError, match=r"rollout_id='nan'.*weight must be a finite number"):
        collate_saw_items([item], pad_token_id=0, device="cpu")


def test_a_batch_whose_every_action_is_truncated_away_is_refused() -> None:
    items = [make_item(6, 3, rid="a"), make_item(8, 2, rid="b")]
    with pytest.raises(ValueError, match=r"max_seq_len=5 truncates away every action token of all 2 items"):
        split_items_by_token_budget(items, micro_token_budget=64, max_seq_len=5)
    kept = split_items_by_token_budget(items, micro_token_budget=64, max_seq_len=7)  # one action survives
    assert sum(sum(it.action_mask) for mb in kept for it in mb) == 1
