"""TrainerConfig defaults, the learning_rate alias and fix-it validation messages."""

from __future__ import annotations

import pytest

from ludic.training.config import TrainerConfig


def test_defaults_match_the_guide() -> None:
    cfg = TrainerConfig()
    assert (cfg.model_device, cfg.lr, cfg.max_seq_len, cfg.micro_token_budget) == ("cpu", 1e-5, 2048, 16384)
    assert (cfg.max_grad_norm, cfg.pad_token_id, cfg.sync_every_steps, cfg.log_every) == (1.0, None, 1, 1)
    assert (cfg.lr_schedule, cfg.warmup_steps, cfg.total_steps) == ("constant", 0, None)
    assert (cfg.eval_every_n_steps, cfg.eval_concurrency, cfg.max_lag) == (None, 32, None)
    assert cfg.sync_explicit is False


def test_learning_rate_is_an_alias_of_lr() -> None:
    cfg = TrainerConfig(learning_rate=2e-5)
    assert cfg.lr == 2e-5 and cfg.learning_rate == 2e-5
    assert TrainerConfig(lr=3e-4).learning_rate == 3e-4
    with pytest.raises(ValueError, match="pass only one"):
        TrainerConfig(lr=1e-3, learning_rate=2e-5)


def test_explicit_sync_every_steps_is_recorded() -> None:
    assert TrainerConfig(sync_every_steps=1).sync_explicit is True
    assert TrainerConfig(sync_every_steps=0).sync_every_steps == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"max_seq_len": 4096, "micro_token_budget": 1024},
            r"micro_token_budget \(1024\) must be >= max_seq_len \(4096\)",
        ),
        ({"lr": 0.0}, "lr must be a finite number > 0"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be a finite number > 0"),
        ({"sync_every_steps": -1}, "sync_every_steps must be an int >= 0"),
        ({"log_every": 0}, "log_every must be an int > 0"),
        ({"eval_every_n_steps": 0}, r"eval_every_n_steps must be an int > 0 \(or None"),
        ({"max_lag": -2}, "max_lag must be None or an int >= 0"),
        ({"betas": (0.9, 1.5)}, "betas must be two numbers"),
        ({"weight_decay": -0.1}, "weight_decay must be >= 0"),
        ({"keep_head_logits": "yes"}, "keep_head_logits must be true or false, got 'yes'"),
    ],
)
def test_bad_values_are_rejected_with_the_field_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**kwargs)


def test_budget_error_says_how_to_fix() -> None:
    with pytest.raises(ValueError, match=r"raise micro_token_budget \(e.g. to 32768\) or lower max_seq_len"):
        TrainerConfig(max_seq_len=4096, micro_token_budget=1024)
