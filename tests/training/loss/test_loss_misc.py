import pytest
import torch

import ludic.training.loss.base as loss_base
from ludic.training.loss import (
    CISPOLoss,
    ClippedSurrogateLoss,
    CompositeLoss,
    LossTerm,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
    TokenKLLoss,
)


def test_sft_is_weighted_masked_nll(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    loss, stats = MaskedCausalLMCrossEntropyLoss(length_normalize=True).compute(logits, batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    want = (-(batch["weight"] * (logp * mask).sum(-1) / mask.sum(-1))).mean()
    torch.testing.assert_close(loss, want)
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(stats["nll_per_token"], -(logp * mask).sum() / 8)


def test_token_kl_is_k3_against_batch_reference(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    loss, stats = TokenKLLoss(ref_logps_key="actor_logps", estimator="k3").compute(logits, batch)
    logp, mask = ref_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    d = (batch["actor_logps"] - logp) * mask
    want = ((torch.exp(d) - 1 - d) * mask).sum(-1).mean()
    torch.testing.assert_close(loss, want)
    (g1,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g2,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g1, g2)
    assert stats["kl_mean"].item() >= 0.0


def test_token_kl_is_zero_when_policy_equals_reference(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    batch["ref_logps"] = ref_logps(logits, batch["input_ids"]).detach()
    loss, _ = TokenKLLoss().compute(logits, batch)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


def test_token_kl_missing_reference_names_the_key(batch_and_logits):
    batch, logits = batch_and_logits
    with pytest.raises(KeyError, match="ref_logps"):
        TokenKLLoss().compute(logits, batch)


def test_composite_sums_weighted_terms_and_prefixes_stats(batch_and_logits):
    batch, logits = batch_and_logits
    cispo, kl = CISPOLoss(), TokenKLLoss(ref_logps_key="actor_logps")
    comp = CompositeLoss(terms=[LossTerm("cispo", cispo, 1.0), LossTerm("kl", kl, 0.1)])
    loss, stats = comp.compute(logits, batch)
    want = cispo.compute(logits, batch)[0] + 0.1 * kl.compute(logits, batch)[0]
    torch.testing.assert_close(loss, want)
    assert stats["loss"] == loss.detach()
    assert stats["kl/weight"].item() == pytest.approx(0.1)
    assert {"cispo/loss", "cispo/clip_frac", "kl/loss", "kl/kl_mean"} <= set(stats)


def test_composite_computes_token_logps_once(batch_and_logits, monkeypatch):
    batch, logits = batch_and_logits
    calls = []
    real = loss_base.compute_token_logps

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(loss_base, "compute_token_logps", counting)
    terms = [
        LossTerm("a", CISPOLoss()),
        LossTerm("b", MaskedCausalLMCrossEntropyLoss()),
        LossTerm("c", TokenKLLoss("actor_logps")),
    ]
    CompositeLoss(terms=terms).compute(logits, batch)
    assert len(calls) == 1


def test_composite_rejects_duplicate_names_and_empty_terms():
    with pytest.raises(ValueError, match="unique"):
        CompositeLoss(terms=[LossTerm("a", CISPOLoss()), LossTerm("a", CISPOLoss())])
    with pytest.raises(ValueError, match="empty"):
        CompositeLoss(terms=[])


ALL_LOSSES = [
    lambda: ReinforceLoss(),
    lambda: TokenClippedSurrogateLoss(length_normalize=True),
    lambda: ClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.2),
    lambda: CISPOLoss(mis_threshold=1.0),
    lambda: MaskedCausalLMCrossEntropyLoss(),
    lambda: TokenKLLoss("actor_logps"),
    lambda: CompositeLoss(terms=[LossTerm("a", CISPOLoss()), LossTerm("b", TokenKLLoss("actor_logps"), 0.5)]),
]


@pytest.mark.parametrize("make_loss", ALL_LOSSES)
def test_loss_is_a_mean_over_sequences_so_splits_do_not_matter(batch_and_logits, make_loss):
    """sum over micro-batches of (mb_size / B) * loss(mb) equals loss(whole batch)."""
    batch, logits = batch_and_logits
    loss_fn = make_loss()
    whole, _ = loss_fn.compute(logits, batch)
    parts = [slice(0, 1), slice(1, 3)]
    split = sum(
        loss_fn.compute(logits[p], {k: v[p] for k, v in batch.items()})[0] * (p.stop - p.start) / 3
        for p in parts
    )
    torch.testing.assert_close(split, whole)
