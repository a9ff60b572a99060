"""Test helpers for checkpoints: an optimizer with state, and a snapshot to show a failed load changed nothing."""

from __future__ import annotations

import pytest
import torch
from tests.training.onpolicy import tiny_model

from ludic.training.checkpoint.manager import CheckpointLoadError, CheckpointManager


def trained_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW after one step on ``model``, so its state (exp_avg, exp_avg_sq, step) is not empty."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    opt.zero_grad()
    return opt


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Copies of the weights and of the optimizer state, per parameter index."""
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}
    return weights, state


def assert_unchanged(model: torch.nn.Module, opt: torch.optim.Optimizer, snap: tuple[dict, dict]) -> None:
    """Every weight and optimizer-state tensor equals the ``snapshot`` taken before."""
    weights, state = snap
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(v, state[i][k]), (i, k)


def assert_load_refused(manager: CheckpointManager, match: str) -> None:
    """Loading into a fresh model and optimizer raises CheckpointLoadError(``match``) and changes neither."""
    other = tiny_model(1, layers=1)
    other_opt = trained_optimizer(other)
    snap = snapshot(other, other_opt)
    with pytest.raises(CheckpointLoadError, match=match):
        manager.load(other, other_opt)
    assert_unchanged(other, other_opt, snap)
