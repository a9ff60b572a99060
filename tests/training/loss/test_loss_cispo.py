import math

import pytest
import torch

from ludic.training.loss import CISPOLoss, TokenClippedSurrogateLoss


@pytest.mark.parametrize("length_normalize", [False, True])
def test_cispo_value_and_grad_match_reference(batch_and_logits, ref_logps, length_normalize):
    batch, logits = batch_and_logits
    loss, stats = CISPOLoss(clip_eps_low=0.5, length_normalize=length_normalize).compute(logits, batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    w = torch.exp(logp.detach() - batch["actor_logps"]).clamp(0.5, 1.2)
    per = (w * batch["weight"][:, None] * logp * mask).sum(-1)
    if length_normalize:
        per = per / mask.sum(-1)
    want = -per.mean()
    torch.testing.assert_close(loss, want)
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g1, g2)
    assert 0.0 <= stats["clip_frac"].item() <= 1.0


def rare_token_case():
    """The guide's example: p_old = 0.001, p_new = 0.005 -> r = 5, far outside [0.8, 1.27]; A = 1."""
    p = 0.005
    other = math.log((1 - p) / 3)
    logits = torch.tensor([[[math.log(p), other, other, other], [0.0] * 4]]).requires_grad_(True)
    batch = {
        "input_ids": torch.tensor([[1, 0]]),  # token 0 scored by logits[:, 0]
        "action_mask": torch.tensor([[0, 1]]),
        "weight": torch.tensor([1.0]),
        "actor_logps": torch.tensor([[0.0, math.log(0.001)]]),
    }
    return logits, batch


def test_cispo_keeps_gradient_for_rare_token_far_outside_clip_range():
    logits, batch = rare_token_case()
    loss, stats = CISPOLoss().compute(logits, batch)
    (g,) = torch.autograd.grad(loss, logits)
    # d/d logit_0 of -1.2 * A * log p_0 = -1.2 * (1 - p_0)
    assert g[0, 0, 0].item() == pytest.approx(-1.2 * (1 - 0.005), rel=1e-4)
    assert stats["ratio_mean"].item() == pytest.approx(5.0, rel=1e-4)
    assert stats["clip_frac"].item() == 1.0


def test_token_clipped_surrogate_has_zero_gradient_for_that_token():
    logits, batch = rare_token_case()
    loss, stats = TokenClippedSurrogateLoss().compute(logits, batch)
    (g,) = torch.autograd.grad(loss, logits)
    assert g.abs().max().item() == 0.0
    assert stats["clip_frac"].item() == 1.0


def test_cispo_defaults_match_the_guide():
    loss = CISPOLoss()
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.length_normalize) == (1e6, 0.2, True)
