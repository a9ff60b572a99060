"""The Trainer's seams are typed protocols, not ``Any``: a loss, an evaluator, a learning-rate scheduler."""

from __future__ import annotations

import typing

import pytest
from torch.optim.lr_scheduler import LRScheduler

from ludic.eval import Evaluator, PolicyEvaluator
from ludic.training import RLAlgorithm, TrainerConfig, make_distill, presets
from ludic.training.layout.forward import micro_batch_loss
from ludic.training.loss import Loss
from ludic.training.trainer import Trainer
from ludic.training.types import RolloutRequest

from .onpolicy import tiny_model
from .test_trainer import make_trainer


def test_the_seams_are_annotated_with_their_protocols():
    assert typing.get_type_hints(RLAlgorithm)["loss"] is Loss
    assert typing.get_type_hints(micro_batch_loss)["loss"] is Loss
    hints = typing.get_type_hints(Trainer.__init__, localns={"PolicyEvaluator": PolicyEvaluator})
    assert hints["evaluator"] == PolicyEvaluator | None
    assert hints["lr_scheduler"] == LRScheduler | None


@pytest.mark.parametrize("name", ["make_reinforce", "make_reinforce_baseline", "make_grpo", "make_gspo",
                                  "make_cispo", "make_scalerl", "make_sft"])  # fmt: skip
def test_every_preset_loss_is_a_loss(name):
    assert isinstance(getattr(presets, name)().loss, Loss)
    assert isinstance(make_distill(tiny_model(), reward_coeff=0.5).loss, Loss)


def test_the_library_evaluator_and_a_plain_function_object_are_policy_evaluators():
    library = Evaluator(engine=object(), requests=[RolloutRequest(env=None, protocol=None)], max_steps=1)  # type: ignore[arg-type]
    assert isinstance(library, PolicyEvaluator)

    class SyncEvaluator:
        def evaluate(self, *, concurrency: int) -> dict[str, float]:
            return {"solve_rate": 0.5, "perf/eval_seconds": 1.0}

    assert isinstance(SyncEvaluator(), PolicyEvaluator)
    cfg = TrainerConfig(lr=1e-2, max_seq_len=32, micro_token_budget=64, eval_every_n_steps=1)
    trainer = make_trainer(cfg=cfg, evaluator=SyncEvaluator())
    stats = trainer.train_step_sync()
    trainer.close()
    assert stats["eval/solve_rate"] == 0.5 and stats["perf/eval_seconds"] == 1.0
