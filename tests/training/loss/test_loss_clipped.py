import pytest
import torch

from ludic.training.loss import ClippedSurrogateLoss, TokenClippedSurrogateLoss


def grads(loss, want, logits):
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(want, logits, retain_graph=True)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_token_clipped_value_and_grad_match_reference(batch_and_logits, ref_logps, length_normalize):
    batch, logits = batch_and_logits
    loss_fn = TokenClippedSurrogateLoss(length_normalize=length_normalize)
    loss, stats = loss_fn.compute(logits, batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    want = 0.0
    for i in range(3):
        terms = []
        for t in range(5):
            if mask[i, t]:
                r = torch.exp(logp[i, t] - batch["actor_logps"][i, t])
                a = batch["weight"][i]
                terms.append(torch.minimum(r * a, r.clamp(0.8, 1.27) * a))
        s = torch.stack(terms).sum()
        want = want - (s / len(terms) if length_normalize else s) / 3
    torch.testing.assert_close(loss, want)
    grads(loss, want, logits)
    assert set(stats) >= {"loss", "adv_mean", "logp_mean", "ratio_mean", "clip_frac", "mismatch_kl"}


def ratio_50_batch() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One action token with actor logp log(0.01) and policy logp log(0.5) (r = 50), advantage A = -1."""
    logits = torch.log(torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])).requires_grad_(True)
    batch = {
        "input_ids": torch.tensor([[0, 1]]),
        "action_mask": torch.tensor([[0, 1]]),
        "weight": torch.tensor([-1.0]),
        "actor_logps": torch.tensor([[0.0, torch.log(torch.tensor(0.01)).item()]]),
    }
    return logits, batch


def test_token_clipped_ratio_clip_caps_ratio_before_min():
    # one action token; actor logp log(0.01), policy logp log(0.5) -> r = 50, A = -1
    logits, batch = ratio_50_batch()
    loss, _ = TokenClippedSurrogateLoss().compute(logits, batch)
    assert loss.item() == pytest.approx(50.0, rel=1e-4)  # min(-50, -1.27) = -50 -> L = 50
    capped, stats = TokenClippedSurrogateLoss(ratio_clip=10.0).compute(logits, batch)
    assert capped.item() == pytest.approx(10.0, rel=1e-4)
    assert stats["ratio_clip_frac"].item() == 1.0


def test_token_clipped_tis_bounds_the_gradient_weight_at_the_cap():
    # r = 50, A = -1: unclipped branch wins; TIS turns the weight on grad log pi from 50 into 2
    logits, batch = ratio_50_batch()
    loss, _ = TokenClippedSurrogateLoss(tis_cap=2.0).compute(logits, batch)
    (g,) = torch.autograd.grad(loss, logits)
    # d(-min(r,2)*A*logp)/d logit_1 = 2 * (1 - p_1) = 2 * 0.5
    assert g[0, 0].tolist() == pytest.approx([-1.0, 1.0], rel=1e-4)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_gspo_value_and_grad_match_reference(batch_and_logits, ref_logps, length_normalize):
    batch, logits = batch_and_logits
    loss_fn = ClippedSurrogateLoss(clip_eps_low=0.1, clip_eps_high=0.2, length_normalize=length_normalize)
    loss, stats = loss_fn.compute(logits, batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    log_s = (logp * mask).sum(-1) - batch["old_logp_action"]
    if length_normalize:
        log_s = log_s / mask.sum(-1)
    s, a = torch.exp(log_s), batch["weight"]
    want = -torch.minimum(s * a, s.clamp(0.9, 1.2) * a).mean()
    torch.testing.assert_close(loss, want)
    grads(loss, want, logits)
    torch.testing.assert_close(stats["ratio_mean"], s.detach().mean())


def test_clipped_losses_keep_kwargs_as_attributes():
    gspo = ClippedSurrogateLoss()
    grpo = TokenClippedSurrogateLoss()
    assert (gspo.clip_eps_low, gspo.clip_eps_high, gspo.length_normalize) == (3e-4, 4e-4, True)
    assert (grpo.clip_eps_low, grpo.clip_eps_high, grpo.length_normalize, grpo.ratio_clip) == (
        0.2,
        0.27,
        False,
        None,
    )


def test_clipped_loss_rejects_negative_eps():
    with pytest.raises(ValueError, match="clip_eps_low"):
        TokenClippedSurrogateLoss(clip_eps_low=-0.1)


def test_token_clipped_missing_actor_logps_names_the_key(batch_and_logits):
    batch, logits = batch_and_logits
    del batch["actor_logps"]
    with pytest.raises(KeyError, match="actor_logps"):
        TokenClippedSurrogateLoss().compute(logits, batch)
