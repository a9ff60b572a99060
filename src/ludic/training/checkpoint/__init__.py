"""Crash-safe checkpoints and resuming runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.checkpoint.manager import (
        LATEST,
        STATE,
        CheckpointConfig,
        CheckpointLoadError,
        CheckpointManager,
        apply_model_state,
        assert_finite_weights,
        capture_rng,
        check_fallback_skip,
        check_model_state,
        check_optimizer_state,
        is_peft_model,
        list_complete,
        load_plain,
        parse_rng,
        parse_trainer_state,
        read_adapter_state,
        read_latest,
        read_model_state,
        restore_rng_state,
        save_model_weights,
        step_dirname,
        step_of,
        write_json_atomic,
        written_at,
    )

__all__ = [
    "LATEST",
    "STATE",
    "CheckpointConfig",
    "CheckpointLoadError",
    "CheckpointManager",
    "apply_model_state",
    "assert_finite_weights",
    "capture_rng",
    "check_fallback_skip",
    "check_model_state",
    "check_optimizer_state",
    "is_peft_model",
    "list_complete",
    "load_plain",
    "parse_rng",
    "parse_trainer_state",
    "read_adapter_state",
    "read_latest",
    "read_model_state",
    "restore_rng_state",
    "save_model_weights",
    "step_dirname",
    "step_of",
    "write_json_atomic",
    "written_at",
]

__getattr__, __dir__ = lazy_exports(__name__)
