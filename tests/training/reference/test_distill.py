"""make_distill: the teacher scores the student's own samples; the loss is the per-token reverse KL."""

from __future__ import annotations

import pytest
import torch
from tests.training.onpolicy import OnPolicySampler, exact_kl, tiny_model

from ludic.registry import get_algorithm
from ludic.training.config import TrainerConfig
from ludic.training.credit.assigners import ConstantCredit, GroupNormalizedReturn
from ludic.training.loss import CISPOLoss, CompositeLoss, TokenKLLoss
from ludic.training.reference.distill import make_distill
from ludic.training.reference.scoring import FrozenModelScorer
from ludic.training.trainer import Trainer


def test_pure_distillation_reads_no_reward_and_scores_with_the_teacher():
    algo = make_distill(tiny_model(1))
    assert isinstance(algo.credit_assigner, ConstantCredit)
    assert isinstance(algo.loss, TokenKLLoss)
    assert (algo.loss.ref_logps_key, algo.loss.estimator, algo.loss.stat_key) == ("teacher_logps", "k2", "kl_teacher")
    assert isinstance(algo.preprocess, FrozenModelScorer) and algo.preprocess.key == "teacher_logps"
    assert get_algorithm("distill") is make_distill


def test_reward_coeff_mixes_in_cispo_on_group_normalised_env_reward():
    algo = make_distill(tiny_model(1), reward_coeff=0.5, group_size=4)
    assert isinstance(algo.credit_assigner, GroupNormalizedReturn) and algo.credit_assigner.group_size == 4
    assert isinstance(algo.loss, CompositeLoss)
    assert [(t.name, type(t.loss), t.weight) for t in algo.loss.terms] == [
        ("distill", TokenKLLoss, 1.0),
        ("reward", CISPOLoss, 0.5),
    ]
    assert algo.loss.promote == ("kl_teacher",)


def test_bad_distill_arguments_name_what_was_wrong():
    with pytest.raises(ValueError, match="needs teacher"):
        make_distill(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reward_coeff must be a number >= 0"):
        make_distill(tiny_model(), reward_coeff=-0.1)
    with pytest.raises(ValueError, match=r"writes batch\['ref_logps'\] but this loss reads batch\['teacher_logps'\]"):
        make_distill(FrozenModelScorer(tiny_model()))


def test_distilling_on_own_samples_shrinks_the_kl_to_the_teacher():
    teacher, student = tiny_model(1), tiny_model(0)
    with torch.no_grad():
        teacher.model.norm.weight.mul_(6.0)  # a confident teacher: sharper next-token distributions
    before = exact_kl(student, teacher)
    algo = make_distill(teacher)
    cfg = TrainerConfig(lr=1e-2, max_seq_len=32, micro_token_budget=512, seed=0)
    trainer = Trainer(model=student, algo=algo, batch_source=OnPolicySampler(student, n=32), cfg=cfg)
    stats = [trainer.train_step_sync() for _ in range(16)]
    trainer.close()
    after = exact_kl(student, teacher)
    assert before > 0.3  # measured 0.52 nats per token
    assert after < 0.7 * before, (before, after)  # measured 0.29 after 16 steps
    assert all(s["train/kl_teacher"] >= 0 for s in stats) and "train/adv_mean" not in stats[-1]
