import pytest
import torch

import ludic.training.loss.base as loss_base
from ludic.training.loss import (
    CISPOLoss,
    CompositeLoss,
    LossTerm,
    MaskedCausalLMCrossEntropyLoss,
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
    loss, stats = TokenKLLoss(ref_logps_key="actor_logps").compute(logits, batch)
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
