"""ProgressLogger: one short line per step with chosen stats; progress_and_metrics keeps every stat."""

from __future__ import annotations

import io
import json

import pytest

from ludic.training.loggers import ProgressLogger, before_after, progress_and_metrics


def test_progress_line_shows_only_chosen_stats() -> None:
    out = io.StringIO()
    stats = {
        "train/avg_total_reward": 0.25,
        "train/loss": -0.01234,
        "perf/step_seconds": 0.42,
        "train/kl": 9.0,
    }
    ProgressLogger("[ex]", total_steps=50, stream=out).log(3, stats)
    assert out.getvalue() == "[ex] step 3/50  reward 0.250  loss -0.012  0.4 s\n"


def test_progress_line_custom_keys_in_order_and_missing_left_out() -> None:
    out = io.StringIO()
    logger = ProgressLogger(keys={"acc": "eval/acc", "loss": "loss"}, precision=2, stream=out)
    logger.log(1, {"loss": 1.0, "perf/step_seconds": 2.0})
    logger.log(2, {"loss": 0.5, "eval/acc": 0.75, "perf/step_seconds": 2.0})
    assert out.getvalue().splitlines() == ["step 1  loss 1.00  2.0 s", "step 2  acc 0.75  loss 0.50  2.0 s"]


def test_progress_every_n_steps_still_prints_eval_steps() -> None:
    out = io.StringIO()
    logger = ProgressLogger(every=5, stream=out)
    for step in range(1, 8):
        stats = {"train/loss": 0.0, "perf/step_seconds": 1.0}
        if step == 3:
            stats["eval/avg_total_reward"] = 0.5
        logger.log(step, stats)
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == ["step 3", "step 5"]


def test_progress_rejects_every_below_one() -> None:
    with pytest.raises(ValueError, match="every must be >= 1, got 0"):
        ProgressLogger(every=0)


def test_progress_and_metrics_writes_every_stat_to_jsonl(tmp_path) -> None:
    out = io.StringIO()
    path = tmp_path / "m" / "metrics.jsonl"
    logger = progress_and_metrics(path, "[x]", stream=out)
    logger.log(
        1, {"train/avg_total_reward": 0.5, "train/loss": 0.1, "train/kl": 0.2, "perf/step_seconds": 1.0}
    )
    logger.close()
    assert json.loads(path.read_text()) == {
        "step": 1, "train/avg_total_reward": 0.5, "train/loss": 0.1, "train/kl": 0.2, "perf/step_seconds": 1.0,
    }  # fmt: skip
    assert out.getvalue() == "[x] step 1  reward 0.500  loss 0.100  1.0 s\n"


def test_before_after_line() -> None:
    assert (
        before_after("held-out reward", 0.12, 0.65, prefix="[q]")
        == "[q] held-out reward 0.120 -> 0.650 (+0.530)"
    )
    assert before_after("win rate", 0.5, 0.25, precision=2) == "win rate 0.50 -> 0.25 (-0.25)"
