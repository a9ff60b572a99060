"""TrainerConfig's learning-rate schedule, and settings the Trainer would otherwise ignore."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import TrainerConfig
from ludic.training.credit.assigners import ConstantCredit
from ludic.training.loss import ReinforceLoss
from ludic.training.schedule import lr_factor
from ludic.training.trainer import Trainer
from ludic.training.types import SAWBatch, SAWItem


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


class OneBatch:
    async def next_batch(self) -> SAWBatch:
        ids = [3, 4, 5, 6, 7, 8]
        item = SAWItem(ids, [1] * 6, [0, 0, 0, 1, 1, 1], 1.0, {"rollout_id": "r"})
        return SAWBatch(items=[item], meta={})


def make_trainer(model: torch.nn.Module, *, cfg: TrainerConfig, **kw: object) -> Trainer:
    algo = RLAlgorithm(
        name="reinforce", credit_assigner=ConstantCredit(), loss=ReinforceLoss(old_logp_key=None)
    )
    return Trainer(model=model, algo=algo, batch_source=OneBatch(), cfg=cfg, **kw)


def _lrs(cfg: TrainerConfig, steps: int) -> list[float]:
    trainer = make_trainer(tiny_model(0), cfg=cfg)
    return [round(h["train/lr"], 6) for h in trainer.train_sync(num_steps=steps)]


def test_linear_warmup_then_linear_decay_reaches_zero_at_total_steps() -> None:
    cfg = TrainerConfig(lr=1.0, max_seq_len=32, micro_token_budget=64, max_grad_norm=None,
                        lr_schedule="linear", warmup_steps=2, total_steps=6)  # fmt: skip
    assert _lrs(cfg, 7) == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]  # HF "linear": 0 at step total_steps


def test_cosine_decay_factors() -> None:
    f = lr_factor("cosine", warmup_steps=0, total_steps=4)
    assert [round(f(s), 4) for s in range(6)] == [1.0, 0.8536, 0.5, 0.1464, 0.0, 0.0]


def test_constant_schedule_with_warmup_only() -> None:
    cfg = TrainerConfig(lr=0.1, max_seq_len=32, micro_token_budget=64, warmup_steps=4)
    assert _lrs(cfg, 5) == [0.025, 0.05, 0.075, 0.1, 0.1]


def test_decaying_schedule_needs_total_steps_and_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="set total_steps"):
        TrainerConfig(lr_schedule="cosine")
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        TrainerConfig(lr_schedule="step", total_steps=3)
    with pytest.raises(ValueError, match=r"warmup_steps \(5\) must be <= total_steps \(3\)"):
        TrainerConfig(lr_schedule="linear", warmup_steps=5, total_steps=3)


def test_given_optimizer_with_lr_in_the_config_is_refused() -> None:
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = TrainerConfig(lr=1e-3, weight_decay=0.1, max_seq_len=32, micro_token_budget=64)
    with pytest.raises(ValueError, match=r"\['lr', 'weight_decay'\] set"):
        make_trainer(model, cfg=cfg, optimizer=optimizer)


def test_given_optimizer_keeps_its_lr_and_takes_the_config_schedule() -> None:
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, lr_schedule="linear", total_steps=2)
    trainer = make_trainer(model, cfg=cfg, optimizer=optimizer)
    assert [h["train/lr"] for h in trainer.train_sync(num_steps=2)] == [0.5, 0.25]


def test_given_scheduler_and_config_schedule_together_are_refused() -> None:
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64, warmup_steps=3)
    with pytest.raises(ValueError, match="pass one of them"):
        make_trainer(model, cfg=cfg, optimizer=optimizer, lr_scheduler=scheduler)


def test_pad_token_id_comes_from_the_model_config_unless_set() -> None:
    from ludic.training._setup import resolve_pad_token_id

    cfg = TrainerConfig(max_seq_len=32, micro_token_budget=64)
    model = tiny_model(0)
    model.config.pad_token_id = 5
    assert make_trainer(model, cfg=cfg).pad_token_id == 5
    model.config.pad_token_id = None  # no pad token: the eos token pads
    assert resolve_pad_token_id(model, cfg) == 1
    explicit = TrainerConfig(max_seq_len=32, micro_token_budget=64, pad_token_id=9)
    assert resolve_pad_token_id(model, explicit) == 9
