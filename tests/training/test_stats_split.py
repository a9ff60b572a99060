"""A step's stats and gradient do not depend on how the batch was split into micro-batches.

Token-mean stats (``kl_ref``, ``clip_frac``, ``mismatch_kl``...) are weighted by each micro-batch's
action tokens, per-sequence stats (``loss``) by its items: one micro-batch or eight give the same
numbers. Before, every stat was item-weighted and ``kl_ref`` moved with the split.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ludic.training import TrainerConfig, make_cispo
from ludic.training.trainer import Trainer
from ludic.training.types import SAWBatch, SAWItem

from .onpolicy import tiny_model
from .test_presets_pinned import GROUP, items_for

TOKEN_MEANS = ["kl_ref", "clip_frac", "mismatch_kl", "mismatch_abs_mean", "logp_mean", "ratio_mean"]


class Fixed:
    def __init__(self, items: list[SAWItem]) -> None:
        self.items = items

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=copy.deepcopy(self.items))


def one_step(budget: int, pack: bool) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """(stats, parameter change) of one SGD step (lr 1, no clipping: the change is minus the gradient)."""
    policy = tiny_model(0)
    algo = make_cispo(group_size=GROUP, kl_coeff=0.1, ref_model=tiny_model(1))
    items = items_for(algo, policy)
    cfg = TrainerConfig(max_seq_len=9, micro_token_budget=budget, pack_sequences=pack, max_grad_norm=None)
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    trainer = Trainer(model=policy, algo=algo, batch_source=Fixed(items), cfg=cfg, optimizer=optimizer)
    stats = trainer.train_step_sync()
    trainer.close()
    return stats, {k: v.detach() - before[k] for k, v in policy.named_parameters()}


@pytest.mark.parametrize("pack", [True, False])
def test_token_mean_stats_and_gradient_do_not_depend_on_the_split(pack):
    whole, whole_delta = one_step(budget=4096, pack=pack)
    split, split_delta = one_step(budget=9, pack=pack)  # the longest item has 9 tokens: one per micro-batch
    assert whole["perf/num_micro_batches"] == 1.0 and split["perf/num_micro_batches"] == 8.0
    loss_keys = [k for k in whole if k.startswith("train/") and k.rsplit("/", 1)[1] in TOKEN_MEANS]
    assert {k.rsplit("/", 1)[1] for k in loss_keys} == set(TOKEN_MEANS)  # "train/cispo/clip_frac", ...
    for key in [*loss_keys, "train/loss", "train/cispo/loss", "train/kl/loss", "train/cispo/adv_mean"]:
        assert split[key] == pytest.approx(whole[key], abs=1e-6), key
    assert split["train/grad_norm"] == pytest.approx(whole["train/grad_norm"], rel=1e-5)
    assert whole["train/kl_ref"] > 0.01 and whole["train/cispo/clip_frac"] > 0.1  # not trivially equal
    for name, delta in whole_delta.items():
        torch.testing.assert_close(split_delta[name], delta, atol=1e-6, rtol=1e-5)
