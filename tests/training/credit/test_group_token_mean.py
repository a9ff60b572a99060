"""``group_token_mean``: the paper's aggregation as a real option of make_cispo / make_scalerl (issue 37).

MiniMax-M1 eq. 4 (and ScaleRL's prompt-level aggregation) divide a group's summed token terms by the
group's total action tokens, then average over groups. The preset with ``group_token_mean=True`` and
``length_normalize=False`` gives exactly that loss and gradient on a batch of unequal lengths and groups.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ludic.training import presets
from ludic.training.credit.group_token_mean import group_token_mean
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

LENGTHS = [1, 4, 2, 3, 6]  # action tokens per reply
GROUPS = ["a", "a", "b", "b", "b"]  # groups of 2 and 3 replies (after a filter, groups may differ in size)
WEIGHTS = [1.0, -1.0, 0.5, -0.25, -0.25]
V = 16


def _items() -> list[SAWItem]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (n, group, w) in enumerate(zip(LENGTHS, GROUPS, WEIGHTS, strict=True)):
        ids = torch.randint(1, V, (2 + n,), generator=g).tolist()
        actor = (-torch.rand(n, generator=g, dtype=torch.float64) * 3).tolist()
        meta = {"rollout_id": f"r{i}", "group_id": group}
        out.append(
            SAWItem(ids, [1] * (2 + n), [0, 0] + [1] * n, w, meta, SampleAttachments(ActorTokenLogps(actor)))
        )
    return out


def _token_logps(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    full = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(full[:, :1]), full], dim=1)


def _paper(logits: torch.Tensor, mb: dict, clip_high: float) -> torch.Tensor:
    """-(1 / n_groups) sum_g (1 / T_g) sum_{i in g} sum_t sg(min(r_it, 1 + eps_high)) A_i log pi_it."""
    logp, mask = _token_logps(logits, mb["input_ids"]), mb["action_mask"].double()
    ratio = torch.exp(logp.detach() - mb["actor_logps"]).clamp(max=1 + clip_high)
    terms = (ratio * torch.tensor(WEIGHTS, dtype=torch.float64)[:, None] * logp * mask).sum(-1)  # [B]
    loss = 0.0
    for group in sorted(set(GROUPS)):
        rows = [i for i, g in enumerate(GROUPS) if g == group]
        loss = loss - terms[rows].sum() / mask[rows].sum()
    return loss / len(set(GROUPS))


@pytest.mark.parametrize("preset", ["make_cispo", "make_scalerl"])
def test_the_preset_computes_the_papers_group_token_mean(preset):
    kwargs = {"filter_zvp": False} if preset == "make_scalerl" else {}
    algo = getattr(presets, preset)(group_size=2, length_normalize=False, group_token_mean=True, **kwargs)
    batch = algo.preprocess(SAWBatch(items=copy.deepcopy(_items())))
    mb = collate_saw_items(batch.items, pad_token_id=0, device="cpu")
    mb = {k: v.double() if v.is_floating_point() else v for k, v in mb.items()}
    logits = torch.randn(len(LENGTHS), mb["input_ids"].shape[1], V, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)  # fmt: skip
    loss, _ = algo.loss.compute(logits, mb)
    want = _paper(logits, mb, algo.loss.clip_eps_high)
    torch.testing.assert_close(loss, want)
    (got_grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(got_grad, want_grad)
    # without the option the same batch aggregates otherwise (the gradient differs)
    plain = getattr(presets, preset)(group_size=2, length_normalize=False, **kwargs)
    plain_mb = collate_saw_items(plain.preprocess(SAWBatch(items=copy.deepcopy(_items()))).items, pad_token_id=0, device="cpu")  # fmt: skip
    plain_mb = {k: v.double() if v.is_floating_point() else v for k, v in plain_mb.items()}
    (plain_grad,) = torch.autograd.grad(plain.loss.compute(logits, plain_mb)[0], logits)
    assert not torch.allclose(plain_grad, want_grad)


def test_weights_are_scaled_by_items_per_group_over_the_groups_tokens_and_token_weights_too():
    items = _items()
    items[1].token_weights = [-1.0, -2.0, -1.0, 0.5]
    out = group_token_mean(SAWBatch(items=items)).items
    per_group = len(LENGTHS) / 2
    scale = {"a": per_group / 5, "b": per_group / 11}  # tokens: a = 1 + 4, b = 2 + 3 + 6
    assert [it.weight for it in out] == pytest.approx(
        [w * scale[g] for w, g in zip(WEIGHTS, GROUPS, strict=True)]
    )
    assert out[1].token_weights == pytest.approx([x * scale["a"] for x in [-1.0, -2.0, -1.0, 0.5]])


def test_the_option_needs_a_summing_loss_and_groups():
    with pytest.raises(ValueError, match="set length_normalize=False"):
        presets.make_cispo(group_token_mean=True)
    with pytest.raises(TypeError, match="group_token_mean must be a bool"):
        presets.make_scalerl(length_normalize=False, group_token_mean="yes")
    items = _items()
    del items[2].meta["group_id"]
    with pytest.raises(ValueError, match=r"rollout_id='r2'\) has no meta\['group_id'\]"):
        group_token_mean(SAWBatch(items=items))
