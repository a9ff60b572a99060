"""The engine's vectorised sampler draws from the right distribution, with and without a nucleus."""

from __future__ import annotations

import pytest
import torch

from ludic.kernels.cpu.sampling_kernel import sample_tokens

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])


def frequencies(temperature: float, top_p: float, n: int = 40_000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    logits = LOGITS.expand(n, -1)
    params = torch.tensor([[temperature, top_p]]).expand(n, -1)
    picks = sample_tokens(logits, params, torch.rand(n, generator=gen))
    return torch.bincount(picks, minlength=len(LOGITS)).float() / n


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_full_distribution_matches_the_softmax(temperature):
    expected = torch.softmax(LOGITS / temperature, dim=-1)
    torch.testing.assert_close(frequencies(temperature, 1.0), expected, atol=0.01, rtol=0)


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p_and_renormalises():
    probs = torch.softmax(LOGITS, dim=-1)  # sorted order: 0, 1, 4, 2, 3
    top_p = float(probs[0] + probs[1]) - 1e-3  # tokens 0 and 1 reach it
    kept = probs[[0, 1]] / probs[[0, 1]].sum()
    freq = frequencies(1.0, top_p)
    torch.testing.assert_close(freq[[0, 1]], kept, atol=0.01, rtol=0)
    assert freq[[2, 3, 4]].sum() == 0


def test_temperature_zero_is_greedy_in_a_mixed_batch():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    params = torch.tensor([[0.0, 1.0], [0.0, 0.5]])
    picks = sample_tokens(logits, params, torch.tensor([0.99, 0.99]))
    assert picks.tolist() == [0, len(LOGITS) - 1]
