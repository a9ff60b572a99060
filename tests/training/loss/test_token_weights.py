"""Per-token weights (``batch["token_weight"]``) in every weighted loss.

Two checks per loss: with each row's token weights all equal to its scalar weight the loss and its
gradient are exactly the scalar path's (the per-token form generalises it), and with different
weights per token the loss is the hand-written per-token formula.
"""

import pytest
import torch

from ludic.training.loss import (
    CISPOLoss,
    ClippedSurrogateLoss,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceBaselineLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
)

LOSSES = {
    "reinforce_is": ReinforceLoss(),
    "reinforce_plain_mean": ReinforceLoss(old_logp_key=None, length_normalize=True),
    "reinforce_tis": ReinforceLoss(tis_cap=1.5),
    "grpo": TokenClippedSurrogateLoss(),
    "grpo_mean_tis": TokenClippedSurrogateLoss(length_normalize=True, tis_cap=1.2, ratio_clip=3.0),
    "gspo": ClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.2),
    "gspo_sum": ClippedSurrogateLoss(length_normalize=False),
    "cispo": CISPOLoss(),
    "cispo_sum_mis": CISPOLoss(length_normalize=False, mis_threshold=2.0),
    "sft": MaskedCausalLMCrossEntropyLoss(),
}


def _grad(loss, logits):
    (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
    return g


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_uniform_token_weights_give_the_scalar_loss_and_gradient(name, batch_and_logits):
    batch, logits = batch_and_logits
    loss_fn = LOSSES[name]
    scalar, scalar_stats = loss_fn.compute(logits, batch)
    per_token = dict(batch, token_weight=batch["weight"][:, None] * batch["action_mask"])
    tokenwise, token_stats = loss_fn.compute(logits, per_token)
    torch.testing.assert_close(tokenwise, scalar)
    torch.testing.assert_close(_grad(tokenwise, logits), _grad(scalar, logits))
    assert _grad(scalar, logits).abs().sum() > 0
    assert set(token_stats) == set(scalar_stats)


def _token_batch(batch):
    w = torch.tensor([[0, 0, 1.0, -2.0, 0.5], [0, 3.0, 3.0, -1.0, 0.25], [0, 0, 0, 4.0, 0]], dtype=torch.float64)
    return dict(batch, token_weight=w * batch["action_mask"])


def test_reinforce_with_token_weights_is_minus_the_weighted_token_sum(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    tb = _token_batch(batch)
    loss, stats = ReinforceLoss(old_logp_key=None).compute(logits, tb)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    want = -(tb["token_weight"] * logp * mask).sum(-1).mean()  # -mean_i sum_t A_it logp_it
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(_grad(loss, logits), _grad(want, logits))
    torch.testing.assert_close(stats["adv_mean"], (tb["token_weight"] * mask).sum() / mask.sum())


def test_token_clip_and_cispo_use_each_tokens_own_advantage(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    tb = _token_batch(batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    adv, ratio = tb["token_weight"], torch.exp((logp - batch["actor_logps"]) * mask)
    clip = TokenClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.2)
    want_clip = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * mask).sum(-1).mean()
    torch.testing.assert_close(clip.compute(logits, tb)[0], want_clip)
    cispo = CISPOLoss(length_normalize=False, clip_eps_high=0.2)
    w = ratio.detach().clamp(max=1.2)
    want_cispo = -(w * adv * logp * mask).sum(-1).mean()
    loss = cispo.compute(logits, tb)[0]
    torch.testing.assert_close(loss, want_cispo)
    torch.testing.assert_close(_grad(loss, logits), _grad(want_cispo, logits))


def test_gspo_averages_the_clipped_sequence_ratio_times_each_tokens_advantage(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    tb = _token_batch(batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    s = torch.exp(((logp * mask).sum(-1) - batch["old_logp_action"]) / mask.sum(-1))[:, None]
    adv = tb["token_weight"]
    surr = torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv)
    want = -((surr * mask).sum(-1) / mask.sum(-1)).mean()
    torch.testing.assert_close(ClippedSurrogateLoss().compute(logits, tb)[0], want)


def test_reinforce_baseline_refuses_token_weights_and_says_what_to_use(batch_and_logits):
    batch, logits = batch_and_logits
    with pytest.raises(ValueError, match="center_weights"):
        ReinforceBaselineLoss().compute(logits, _token_batch(batch))
