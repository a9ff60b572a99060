"""FrozenModelScorer: a frozen model's action-token log-probs, attached to items and collated."""

from __future__ import annotations

import pytest
import torch
from tests.training.onpolicy import tiny_model

from ludic.training.algorithm import chain_preprocess, drop_zero_weight
from ludic.training.layout.micro_batching import collate_saw_items, truncate_item
from ludic.training.loss import compute_token_logps
from ludic.training.reference.scoring import FrozenModelScorer
from ludic.training.types import SampleAttachments, SAWBatch, SAWItem


def item(length: int, weight: float = 1.0, rid: str = "r") -> SAWItem:
    ids = [(5 * i + length) % 60 + 2 for i in range(length)]
    return SAWItem(ids, [1] * length, [0, 0, 0] + [1] * (length - 3), weight, {"rollout_id": rid})


def alone(model: torch.nn.Module, it: SAWItem) -> list[float]:
    """The item's action-token log-probs from a forward of that item by itself."""
    with torch.no_grad():
        ids = torch.tensor([it.input_ids])
        logps = compute_token_logps(model(input_ids=ids).logits, ids)[0]
    return logps[torch.tensor(it.action_mask).bool()].tolist()


def test_scores_equal_each_items_own_forward_whatever_the_packing():
    model = tiny_model()
    items = [item(n, rid=f"r{n}") for n in (9, 4, 14, 6, 11)]
    scorer = FrozenModelScorer(model, micro_token_budget=24)  # several forwards, padded rows
    scorer.score_items(items)
    for it in items:
        got = it.attachments.frozen_logps["ref_logps"]
        assert len(got) == it.num_action_tokens
        torch.testing.assert_close(torch.tensor(got), torch.tensor(alone(model, it)), atol=1e-5, rtol=0)
        assert all(v < 0 for v in got)


def test_a_module_is_snapshotted_so_training_the_policy_does_not_move_the_reference():
    policy = tiny_model()
    before = alone(policy, item(8))
    scorer = FrozenModelScorer(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    it = item(8)
    scorer.score_items([it])
    torch.testing.assert_close(torch.tensor(it.attachments.frozen_logps["ref_logps"]), torch.tensor(before))
    assert all(p.requires_grad for p in policy.parameters())  # the policy itself is left trainable
    assert not any(p.requires_grad for p in scorer.model.parameters())


def test_a_model_directory_loads_and_scores_like_the_module(tmp_path):
    model = tiny_model(3)
    model.save_pretrained(tmp_path / "ref")
    it = item(10)
    FrozenModelScorer(tmp_path / "ref", key="teacher_logps")(SAWBatch([it]))
    got = it.attachments.frozen_logps["teacher_logps"]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(alone(model, item(10))), atol=1e-5, rtol=0)


def test_bad_model_arguments_are_refused_with_what_was_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        FrozenModelScorer(tmp_path)
    with pytest.raises(TypeError, match="got int"):
        FrozenModelScorer(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="micro_token_budget"):
        FrozenModelScorer(tiny_model(), micro_token_budget=0)


class Bigram(torch.nn.Module):
    """Not a transformers model: the scorer falls back to padded rows and full logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.emb = torch.nn.Embedding(64, 64)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.emb(input_ids).log_softmax(-1)  # [B, T, V] logits


def test_a_plain_module_is_scored_through_the_padded_logits_path():
    model = Bigram()
    items = [item(n, rid=f"r{n}") for n in (5, 9, 7)]
    FrozenModelScorer(model, micro_token_budget=16).score_items(items)
    for it in items:
        ids = torch.tensor(it.input_ids)
        want = model.emb.weight.log_softmax(-1)[ids[:-1], ids[1:]][2:]  # token t scored at t - 1; actions from 3
        torch.testing.assert_close(torch.tensor(it.attachments.frozen_logps["ref_logps"]), want.detach())


def test_collation_places_frozen_logps_at_action_positions_and_truncation_trims_them():
    a, b = item(5), item(4)
    a.attachments.frozen_logps["ref_logps"] = [-1.0, -2.0]
    b.attachments.frozen_logps["ref_logps"] = [-3.0]
    mb = collate_saw_items([a, b], pad_token_id=0, device="cpu")
    assert mb["ref_logps"].tolist() == [[0, 0, 0, -1.0, -2.0], [0, 0, 0, -3.0, 0]]
    cut = truncate_item(a, 4)
    assert cut.attachments.frozen_logps == {"ref_logps": [-1.0]}
    b.attachments = SampleAttachments()
    with pytest.raises(ValueError, match=r"no frozen_logps\['ref_logps'\] while 1 of 2"):
        collate_saw_items([a, b], pad_token_id=0, device="cpu")


def test_an_item_with_the_wrong_number_of_frozen_logps_is_refused():
    with pytest.raises(ValueError, match=r"frozen_logps\['ref_logps'\] has 1 entries, action_mask marks 2"):
        SAWItem([1, 2, 3], [1, 1, 1], [0, 1, 1], 1.0, attachments=SampleAttachments(frozen_logps={"ref_logps": [0.0]}))


def test_items_dropped_by_earlier_preprocessing_are_never_scored():
    scorer = FrozenModelScorer(tiny_model())
    batch = chain_preprocess(drop_zero_weight, scorer)(SAWBatch([item(6, 0.0, "a"), item(7, 1.0, "b")]))
    assert [it.meta["rollout_id"] for it in batch.items] == ["b"]
    assert "ref_logps" in batch.items[0].attachments.frozen_logps


def test_frozen_logps_survive_a_jsonl_round_trip():
    from ludic.training.batching.jsonl import saw_item_from_dict, saw_item_to_dict

    it = item(5)
    it.attachments.frozen_logps["teacher_logps"] = [-0.25, -1.5]
    back = saw_item_from_dict(saw_item_to_dict(it))
    assert back.attachments.frozen_logps == {"teacher_logps": [-0.25, -1.5]}
