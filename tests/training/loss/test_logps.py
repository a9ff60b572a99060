import pytest
import torch
from jaxtyping import TypeCheckError

from ludic.training.loss import compute_logp_action, compute_token_logps
from ludic.training.shapes import CHECK_SHAPES


def test_token_logps_match_log_softmax_with_causal_shift(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    for chunk in (1, 2, 512):  # chunking must not change the numbers
        got = compute_token_logps(logits, batch["input_ids"], chunk=chunk)
        torch.testing.assert_close(got, ref_logps(logits, batch["input_ids"]))


def test_token_logps_gradient_matches_autograd_of_log_softmax(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    g = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (got,) = torch.autograd.grad((compute_token_logps(logits, batch["input_ids"], chunk=2) * g).sum(), logits)
    (want,) = torch.autograd.grad((ref_logps(logits, batch["input_ids"]) * g).sum(), logits)
    torch.testing.assert_close(got, want)
    assert got[:, -1].abs().sum() == 0  # the last position scores no token


def test_token_logps_on_a_hand_checkable_case():
    # uniform logits over V=4: every token has log-prob log(1/4)
    logits = torch.zeros(1, 3, 4)
    got = compute_token_logps(logits, torch.tensor([[0, 1, 2]]))
    assert got[0].tolist() == pytest.approx([0.0, -1.3862944, -1.3862944])


def test_logp_action_sums_or_averages_over_action_tokens(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    ref = ref_logps(logits, batch["input_ids"]) * batch["action_mask"]
    summed = compute_logp_action(logits, batch["input_ids"], batch["action_mask"])
    mean = compute_logp_action(logits, batch["input_ids"], batch["action_mask"], length_normalize=True)
    torch.testing.assert_close(summed, ref.sum(-1))
    torch.testing.assert_close(mean, ref.sum(-1) / torch.tensor([3.0, 4.0, 1.0], dtype=torch.float64))


def test_token_logps_reject_mismatched_shapes():
    if CHECK_SHAPES:  # the suite's default: the annotation check fires first and names the dimensions
        with pytest.raises(TypeCheckError, match=r"input_ids[\s\S]*B=2\nT=3\nV=4"):
            compute_token_logps(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    unchecked = getattr(compute_token_logps, "__wrapped__", compute_token_logps)
    with pytest.raises(ValueError, match=r"logits \(2, 3, 4\), input_ids \(2, 4\)"):
        unchecked(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


def test_bf16_logits_are_upcast_and_give_a_bf16_gradient(batch_and_logits, ref_logps):
    batch, logits = batch_and_logits
    low = logits.detach().to(torch.bfloat16).requires_grad_(True)
    got = compute_token_logps(low, batch["input_ids"], chunk=2)
    assert got.dtype == torch.float32
    want = ref_logps(low.detach().double(), batch["input_ids"])
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    got.sum().backward()
    assert low.grad.dtype == torch.bfloat16
    (ref_grad,) = torch.autograd.grad(ref_logps(logits, batch["input_ids"]).sum(), logits)
    torch.testing.assert_close(low.grad.double(), ref_grad, atol=2e-2, rtol=2e-2)
