import pytest
import torch

from ludic.training.loss import ReinforceBaselineLoss, ReinforceLoss


def reference_reinforce(logp, batch, *, length_normalize, use_is, adv=None):
    mask = batch["action_mask"].double()
    adv = batch["weight"] if adv is None else adv
    seq = (logp * mask).sum(-1)
    if length_normalize:
        seq = seq / mask.sum(-1)
    r = torch.exp((logp * mask).sum(-1).detach() - batch["old_logp_action"]) if use_is else 1.0
    return (-(r * adv * seq)).mean()


@pytest.mark.parametrize("length_normalize", [False, True])
def test_reinforce_value_and_grad_match_reference(batch_and_logits, ref_logps, length_normalize):
    batch, logits = batch_and_logits
    loss, stats = ReinforceLoss(length_normalize=length_normalize).compute(logits, batch)
    want = reference_reinforce(
        ref_logps(logits, batch["input_ids"]), batch, length_normalize=length_normalize, use_is=True
    )
    torch.testing.assert_close(loss, want)
    (g1,) = torch.autograd.grad(loss, logits)
    (g2,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g1, g2)
    assert stats["loss"] == loss.detach()
    assert stats["adv_mean"].item() == pytest.approx(1.0)


def test_reinforce_without_is_is_plain_policy_gradient(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    del batch["old_logp_action"]
    loss, stats = ReinforceLoss(old_logp_key=None).compute(logits, batch)
    want = reference_reinforce(
        ref_logps(logits, batch["input_ids"]), batch, length_normalize=False, use_is=False
    )
    torch.testing.assert_close(loss, want)
    assert stats["ratio_mean"].item() == 1.0


def test_reinforce_missing_old_logp_key_names_it(batch_and_logits):
    batch, logits = batch_and_logits
    with pytest.raises(KeyError, match="my_old_logps"):
        ReinforceLoss(old_logp_key="my_old_logps").compute(logits, batch)


def test_reinforce_tis_caps_the_sequence_weight(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    loss, stats = ReinforceLoss(tis_cap=0.5).compute(logits, batch)
    logp = ref_logps(logits, batch["input_ids"])
    mask = batch["action_mask"].double()
    r = torch.exp((logp * mask).sum(-1).detach() - batch["old_logp_action"]).clamp(max=0.5)
    torch.testing.assert_close(loss, (-(r * batch["weight"] * (logp * mask).sum(-1))).mean())
    assert "mismatch_abs_mean" in stats and "mismatch_kl" in stats


def test_reinforce_baseline_subtracts_batch_mean_weight(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    loss, stats = ReinforceBaselineLoss(old_logp_key=None).compute(logits, batch)
    adv = batch["weight"] - 1.0  # weights 1.5, -0.5, 2.0 have mean 1.0
    want = reference_reinforce(
        ref_logps(logits, batch["input_ids"]), batch, length_normalize=False, use_is=False, adv=adv
    )
    torch.testing.assert_close(loss, want)
    assert stats["adv_mean"].item() == pytest.approx(0.0)
