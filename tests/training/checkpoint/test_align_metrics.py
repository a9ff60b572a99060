"""``align_metrics``: after a resume, ``metrics.jsonl`` holds one record per step up to the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from ludic.training.checkpoint.resume import Resumed, align_metrics


def _write(path: Path, steps: list[int], tail: str = "") -> None:
    path.write_text("".join(json.dumps({"step": s, "train/loss": float(s)}) + "\n" for s in steps) + tail)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_the_checkpoint_step_missing_its_record_gets_the_checkpoints_stats(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2, 3], tail='{"step": 4, "tr')  # killed while writing step 4's line
    report = align_metrics(jsonl, Resumed(step=4, stats={"train/loss": 4.5, "eval/accuracy": 0.25}))
    assert (report.dropped, report.restored) == (1, True)
    assert _steps(jsonl) == [1, 2, 3, 4]
    assert json.loads(jsonl.read_text().splitlines()[-1]) == {"step": 4, "train/loss": 4.5, "eval/accuracy": 0.25}


def test_records_after_the_checkpoint_go_and_its_own_record_stays_once(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2, 3, 4, 5, 6])
    report = align_metrics(jsonl, Resumed(step=4, stats={"train/loss": 99.0}))
    assert (report.dropped, report.restored) == (2, False)
    assert _steps(jsonl) == [1, 2, 3, 4]
    assert json.loads(jsonl.read_text().splitlines()[-1])["train/loss"] == 4.0  # the logged line, not the saved one


def test_a_step_that_was_not_due_to_log_gets_no_record(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [2, 4])
    report = align_metrics(jsonl, Resumed(step=5, stats={"train/loss": 5.0}), log_every=2)
    assert (report.dropped, report.restored) == (0, False)
    assert _steps(jsonl) == [2, 4]


def test_a_checkpoint_without_stats_restores_nothing(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2])
    assert not align_metrics(jsonl, Resumed(step=3)).restored  # e.g. saved by save_checkpoint(), outside a step
    assert _steps(jsonl) == [1, 2]
