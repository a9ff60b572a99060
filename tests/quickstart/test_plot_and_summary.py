"""The quickstart's artefacts: the reward/loss PNG from a metrics JSONL, and the summary screen."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run import QuickstartResult
from ludic.quickstart.summary import print_summary
from ludic.training.loggers.plot import plot_metrics, read_metrics, series


def _write_metrics(path: Path) -> None:
    rows = [{"step": s, "train/avg_total_reward": 0.1 * s, "train/loss": 1.0 / s} for s in range(1, 8)]
    rows.append({"step": 7, "eval/avg_total_reward": 0.7})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_series_skips_rows_without_the_key(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    _write_metrics(path)
    rows = read_metrics(path)
    assert series(rows, "eval/avg_total_reward") == ([7], [0.7])
    assert series(rows, "train/loss")[0] == [1, 2, 3, 4, 5, 6, 7]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    _write_metrics(path)
    png = plot_metrics(path, tmp_path / "sub" / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5_000


def test_summary_shows_before_after_and_gain() -> None:
    console = Console(record=True, width=120)
    cfg = QuickstartConfig(steps=300, sft_steps=30)
    result = QuickstartResult(
        eval_initial=0.0,
        eval_before_rl=0.12,
        eval_after=0.81,
        train_seconds=100.0,
        rl_seconds_per_step=0.25,
        output_dir="o",
        paths={"plot": "o/training_curve.png"},
    )
    print_summary(cfg, result, console=console)
    text = console.export_text()
    assert "prompt-ignoring policy (chance)" in text and "0.125" in text
    assert "after SFT warm start (30 steps) = start of RL" in text and "0.120" in text
    assert "after grpo (300 steps)" in text and "0.810" in text
    assert "+0.690" in text
    assert "o/training_curve.png" in text
