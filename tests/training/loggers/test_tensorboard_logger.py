"""TensorBoardLogger: every finite numeric stat lands as a scalar at its step, read back from the event file."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ludic.training.loggers import TeeLogger, TensorBoardLogger


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in ``log_dir``'s event files: key -> [(step, value)]."""
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}


def test_scalars_are_written_under_their_prefixed_keys(tmp_path: Path) -> None:
    with TeeLogger(TensorBoardLogger(tmp_path / "tb")) as logger:
        logger.log(1, {"train/loss": 0.5, "eval/avg_total_reward": 0.25, "step_seconds": 1.5})
        logger.log(2, {"loss": 0.25, "note": "text", "bad": float("nan"), "flag": True})
    got = scalars(tmp_path / "tb")
    assert got["train/loss"] == [(1, 0.5), (2, 0.25)]  # "loss" auto-prefixed as everywhere else
    assert got["eval/avg_total_reward"] == [(1, 0.25)] and got["perf/step_seconds"] == [(1, 1.5)]
    assert not {"train/note", "train/bad", "train/flag"} & set(got)  # text, NaN and bools are left out


def test_a_closed_logger_refuses_to_log(tmp_path: Path) -> None:
    logger = TensorBoardLogger(tmp_path / "tb")
    logger.close()
    with pytest.raises(RuntimeError, match="closed"):
        logger.log(1, {"loss": 1.0})
