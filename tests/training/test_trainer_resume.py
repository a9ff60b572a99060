"""Resuming from a checkpoint continues exactly: same losses as an uninterrupted run (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer

from .onpolicy import NoCredit, StepIndexedSource, tiny_model


def _trainer(model: torch.nn.Module, source: StepIndexedSource, ckpt: CheckpointConfig | None) -> Trainer:
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    cfg = TrainerConfig(lr=1e-2, max_seq_len=16, micro_token_budget=16)
    return Trainer(model=model, algo=algo, batch_source=source, cfg=cfg, checkpoint_config=ckpt)


def test_losses_after_resume_match_an_uninterrupted_run(tmp_path: Path) -> None:
    straight = _trainer(tiny_model(0), StepIndexedSource(), None)
    expected = [straight.train_step_sync()["train/loss"] for _ in range(4)]

    ckpt = CheckpointConfig(output_dir=tmp_path, every_n_steps=2, max_to_keep=1)
    first = _trainer(tiny_model(0), StepIndexedSource(), ckpt)
    head = [first.train_step_sync()["train/loss"] for _ in range(2)]
    assert json.loads((tmp_path / "latest.json").read_text()) == {"step": 2, "path": "step_000002"}

    resumed = _trainer(tiny_model(123), StepIndexedSource(start=2), ckpt)  # different init: weights must load
    state = resumed.load_checkpoint()
    assert resumed.step == 2 and state["step"] == 2 and state["config"]["lr"] == 1e-2
    tail = [resumed.train_step_sync()["train/loss"] for _ in range(2)]

    assert head == expected[:2]
    assert tail == expected[2:]  # bit-identical on CPU: weights, AdamW moments and step counts restored
