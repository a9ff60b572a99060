"""Prefix grouping, print/tee/jsonl sinks, the rich dashboard rendered to a string, wandb offline."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import torch
from rich.console import Console

from ludic.training.loggers import (
    JsonlLogger,
    PrintLogger,
    RichLiveLogger,
    TeeLogger,
    WandbLogger,
    group_by_prefix,
    prefix_key,
    sparkline,
)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("loss", "train/loss"),
        ("eval_accuracy", "eval/accuracy"),
        ("gpu_mem_alloc_mb", "perf/gpu_mem_alloc_mb"),
        ("step_seconds", "perf/step_seconds"),
        ("train/loss", "train/loss"),
        ("eval/all_passed_rate", "eval/all_passed_rate"),
        ("perf/gpu_mem_peak_mb", "perf/gpu_mem_peak_mb"),
        ("cispo/clip_frac", "train/cispo/clip_frac"),
    ],
)
def test_ungrouped_keys_are_auto_prefixed(key: str, expected: str) -> None:
    assert prefix_key(key) == expected


def test_group_by_prefix_splits_three_columns() -> None:
    groups = group_by_prefix({"loss": 1.0, "eval/acc": 0.5, "perf/step_seconds": 2.0, "time/wait_seconds": 0.5})
    assert groups == {
        "train": {"loss": 1.0}, "eval": {"acc": 0.5}, "perf": {"step_seconds": 2.0}, "time": {"wait_seconds": 0.5}
    }


def test_print_logger_writes_one_prefixed_line() -> None:
    out = io.StringIO()
    PrintLogger(prefix="[train]", precision=2, stream=out).log(3, {"loss": 0.12345, "eval/acc": 1})
    assert out.getvalue() == "[train] step 3 | eval/acc=1 | train/loss=0.12\n"


class _Broken:
    def log(self, step: int, stats: dict) -> None:
        raise RuntimeError("dashboard exploded")


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict]] = []

    def log(self, step: int, stats: dict) -> None:
        self.calls.append((step, dict(stats)))


def test_tee_logger_continues_past_a_failing_sink_and_reports_it(caplog: pytest.LogCaptureFixture) -> None:
    first, last = _Recorder(), _Recorder()
    broken = _Broken()
    tee = TeeLogger(first, broken, last)
    with caplog.at_level(logging.WARNING):
        tee.log(1, {"loss": 1.0})
        tee.log(2, {"loss": 0.5})
    assert first.calls == last.calls == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]
    assert [(step, sink) for step, sink, _ in tee.failures] == [(1, broken), (2, broken)]
    assert "_Broken.log failed at step 1" in caplog.text and "dashboard exploded" in caplog.text


def test_jsonl_logger_writes_step_then_stats_per_line(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        logger.log(1, {"train/loss": torch.tensor(0.5), "train/avg_total_reward": 0.25})
        logger.log(2, {"train/loss": 0.25})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"step": 1, "train/loss": 0.5, "train/avg_total_reward": 0.25},
        {"step": 2, "train/loss": 0.25},
    ]


def test_sparkline_maps_lowest_to_highest_block() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▁▁"
    assert sparkline([]) == ""


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=150, color_system=None), buf


def test_rich_live_logger_renders_three_columns_and_sparkline() -> None:
    console, buf = _console()
    logger = RichLiveLogger(
        keys=["loss", "avg_total_reward", "eval/acc", "perf/step_seconds"],
        spark_key="avg_total_reward",
        precision=3,
        total_steps=4,
        console=console,
    )
    with logger:
        for step, reward in enumerate([0.0, 0.5, 1.0], start=1):
            logger.log(
                step, {"train/loss": 1.0 / step, "train/avg_total_reward": reward, "train/hidden": 9.0}
            )
        logger.log(4, {"eval/acc": 0.75, "perf/step_seconds": 0.2})
    text = buf.getvalue()
    for expected in (
        "train",
        "eval",
        "perf",
        "loss: 0.333",
        "acc: 0.750",
        "step_seconds: 0.200",
        "▁▅█",
        "step 4/4",
    ):
        assert expected in text, expected
    assert "hidden" not in text


def test_rich_live_logger_prints_when_used_without_context() -> None:
    console, buf = _console()
    RichLiveLogger(keys=None, console=console).log(7, {"loss": 2.5})
    assert "step 7" in buf.getvalue() and "loss: 2.5000" in buf.getvalue()


def test_wandb_logger_offline_writes_a_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(
        project="ludic-test", name="offline-run", config={"lr": 1e-3}, init_kwargs={"dir": str(tmp_path)}
    )
    try:
        logger.log(1, {"loss": 0.5, "eval_acc": 0.25})
        run_dir = Path(logger.run.dir).parent
    finally:
        logger.close()
    assert run_dir.name.startswith("offline-run-")
    assert list(run_dir.glob("*.wandb")), f"no .wandb file in {run_dir}"
