"""What CISPO's docstring says it computes against MiniMax-M1's eq. 4 (issue 37: "as in the paper" was wrong).

The paper divides a group's summed token terms by the group's total tokens. ``length_normalize=False``
gives the same gradient direction for one group (a constant factor apart); ``True`` (the default) does not
when the replies' lengths differ.
"""

from __future__ import annotations

import torch

from ludic.training.loss import CISPOLoss


def _group_of_lengths_1_and_4(reference_token_logps):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    action_mask = torch.tensor([[0, 0, 0, 0, 1], [0, 1, 1, 1, 1]])  # one reply of 1 token, one of 4
    input_ids = torch.tensor([[1, 2, 3, 4, 5], [0, 1, 2, 3, 4]])
    batch = {
        "input_ids": input_ids, "attention_mask": torch.ones(2, 5, dtype=torch.long), "action_mask": action_mask,
        "weight": torch.tensor([1.0, -1.0], dtype=torch.float64),
        "actor_logps": reference_token_logps(logits.detach(), input_ids) * action_mask,  # on-policy: r = 1
    }  # fmt: skip
    return logits, batch


def _grad(loss, logits):
    (g,) = torch.autograd.grad(loss, logits)
    return g.flatten()


def _paper(logits, batch, reference_token_logps):
    """MiniMax-M1 eq. 4 on one group: -(1 / sum_i |o_i|) sum_i sum_t sg(w_it) A_i log pi_it (w = 1 here)."""
    logp, mask = reference_token_logps(logits, batch["input_ids"]), batch["action_mask"].double()
    return -(batch["weight"][:, None] * logp * mask).sum() / mask.sum()


def test_without_length_normalize_the_gradient_is_the_papers_scaled_by_tokens_over_replies(ref_logps):
    logits, batch = _group_of_lengths_1_and_4(ref_logps)
    ours = _grad(CISPOLoss(length_normalize=False).compute(logits, batch)[0], logits)
    paper = _grad(_paper(logits, batch, ref_logps), logits)
    torch.testing.assert_close(ours, paper * (5 / 2))  # sum_i |o_i| / B = 5 / 2


def test_with_length_normalize_the_direction_differs_from_the_papers(ref_logps):
    logits, batch = _group_of_lengths_1_and_4(ref_logps)
    ours = _grad(CISPOLoss(length_normalize=True).compute(logits, batch)[0], logits)
    paper = _grad(_paper(logits, batch, ref_logps), logits)
    cosine = torch.nn.functional.cosine_similarity(ours, paper, dim=0).item()
    assert cosine < 0.95  # per-sequence means weigh the 1-token reply's token 4x the others'
