"""A small hand-sized batch shared by the loss tests, and an independent log-prob reference."""

import pytest
import torch


@pytest.fixture
def batch_and_logits():
    """B=3 sequences of T=5 over V=7 tokens; sequence 2 is padded after 4 tokens."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g, dtype=torch.float64).requires_grad_(True)
    input_ids = torch.tensor([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3], [4, 4, 5, 6, 0]])
    action_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 0]])
    actor_logps = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 2.0) * action_mask
    batch = {
        "input_ids": input_ids,
        "attention_mask": torch.tensor([[1] * 5, [1] * 5, [1, 1, 1, 1, 0]]),
        "action_mask": action_mask,
        "weight": torch.tensor([1.5, -0.5, 2.0], dtype=torch.float64),
        "actor_logps": actor_logps,
        "old_logp_action": actor_logps.sum(-1),
    }
    return batch, logits


def reference_token_logps(logits, input_ids):
    """Plain log_softmax + gather, shifted: position t scored by logits at t-1; position 0 is 0."""
    full = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(full[:, :1]), full], dim=1)


@pytest.fixture
def ref_logps():
    return reference_token_logps
