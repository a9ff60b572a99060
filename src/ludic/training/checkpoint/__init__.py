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

_EXPORTS = {
    "CheckpointConfig": ("ludic.training.checkpoint.manager", "CheckpointConfig"),
    "CheckpointLoadError": ("ludic.training.checkpoint.manager", "CheckpointLoadError"),
    "CheckpointManager": ("ludic.training.checkpoint.manager", "CheckpointManager"),
    "LATEST": ("ludic.training.checkpoint.manager", "LATEST"),
    "STATE": ("ludic.training.checkpoint.manager", "STATE"),
    "apply_model_state": ("ludic.training.checkpoint.manager", "apply_model_state"),
    "assert_finite_weights": ("ludic.training.checkpoint.manager", "assert_finite_weights"),
    "capture_rng": ("ludic.training.checkpoint.manager", "capture_rng"),
    "check_fallback_skip": ("ludic.training.checkpoint.manager", "check_fallback_skip"),
    "check_model_state": ("ludic.training.checkpoint.manager", "check_model_state"),
    "check_optimizer_state": ("ludic.training.checkpoint.manager", "check_optimizer_state"),
    "is_peft_model": ("ludic.training.checkpoint.manager", "is_peft_model"),
    "list_complete": ("ludic.training.checkpoint.manager", "list_complete"),
    "load_plain": ("ludic.training.checkpoint.manager", "load_plain"),
    "parse_rng": ("ludic.training.checkpoint.manager", "parse_rng"),
    "parse_trainer_state": ("ludic.training.checkpoint.manager", "parse_trainer_state"),
    "read_adapter_state": ("ludic.training.checkpoint.manager", "read_adapter_state"),
    "read_latest": ("ludic.training.checkpoint.manager", "read_latest"),
    "read_model_state": ("ludic.training.checkpoint.manager", "read_model_state"),
    "restore_rng_state": ("ludic.training.checkpoint.manager", "restore_rng_state"),
    "save_model_weights": ("ludic.training.checkpoint.manager", "save_model_weights"),
    "step_dirname": ("ludic.training.checkpoint.manager", "step_dirname"),
    "step_of": ("ludic.training.checkpoint.manager", "step_of"),
    "write_json_atomic": ("ludic.training.checkpoint.manager", "write_json_atomic"),
    "written_at": ("ludic.training.checkpoint.manager", "written_at"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
