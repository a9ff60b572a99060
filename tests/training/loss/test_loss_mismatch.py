import math

import pytest
import torch

from ludic.training.loss import CISPOLoss, ClippedSurrogateLoss, ReinforceLoss, TokenClippedSurrogateLoss


def two_sequence_case():
    """Uniform policy over V=2 (logp = log 0.5 everywhere); actor logps differ by 0.1 and by 1.0."""
    logits = torch.zeros(2, 3, 2, requires_grad=True)
    half = math.log(0.5)
    actor = torch.tensor([[0.0, half - 0.1, half + 0.1], [0.0, half - 1.0, half - 1.0]])
    batch = {
        "input_ids": torch.tensor([[0, 1, 0], [0, 0, 1]]),
        "action_mask": torch.tensor([[0, 1, 1], [0, 1, 1]]),
        "weight": torch.tensor([1.0, 1.0]),
        "actor_logps": actor,
        "old_logp_action": actor.sum(-1),
    }
    return logits, batch


@pytest.mark.parametrize(
    "loss_cls", [ReinforceLoss, TokenClippedSurrogateLoss, ClippedSurrogateLoss, CISPOLoss]
)
def test_every_ratio_loss_reports_mismatch(loss_cls):
    logits, batch = two_sequence_case()
    _, stats = loss_cls().compute(logits, batch)
    assert stats["mismatch_abs_mean"].item() == pytest.approx((0.1 + 0.1 + 1.0 + 1.0) / 4, rel=1e-5)
    k3 = [math.expm1(d) - d for d in (0.1, -0.1, 1.0, 1.0)]
    assert stats["mismatch_kl"].item() == pytest.approx(sum(k3) / 4, rel=1e-5)


@pytest.mark.parametrize(
    "loss_cls", [ReinforceLoss, TokenClippedSurrogateLoss, ClippedSurrogateLoss, CISPOLoss]
)
def test_mis_masks_sequences_whose_mismatch_exceeds_threshold(loss_cls):
    logits, batch = two_sequence_case()
    loss, stats = loss_cls(mis_threshold=0.5).compute(logits, batch)
    (g,) = torch.autograd.grad(loss, logits)
    assert stats["mis_masked_frac"].item() == 0.5
    assert g[1].abs().max().item() == 0.0  # sequence 1 (mismatch 1.0) adds nothing
    assert g[0].abs().max().item() > 0.0
    # the masked sequence still counts in the mean: loss = seq-0 loss / 2
    only_first = {k: v[:1] for k, v in batch.items()}
    alone, _ = loss_cls().compute(logits[:1], only_first)
    assert loss.item() == pytest.approx(alone.item() / 2, rel=1e-5)


def test_mis_without_actor_logps_names_the_key():
    logits, batch = two_sequence_case()
    del batch["actor_logps"]
    with pytest.raises(KeyError, match="actor_logps"):
        ReinforceLoss(mis_threshold=0.5).compute(logits, batch)


def test_guards_reject_bad_values():
    with pytest.raises(ValueError, match="tis_cap"):
        CISPOLoss(tis_cap=0.0)
    with pytest.raises(ValueError, match="mis_threshold"):
        ReinforceLoss(mis_threshold=-1.0)
