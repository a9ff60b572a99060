"""``ludic train`` / ``ludic eval`` end to end on a tiny local model (embedded engine, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, model: Path) -> Path:
    return write_run_config(tmp_path, model, steps=2, eval_episodes=4, eval_extra="every_n_steps = 1", plot=True)


def test_train_writes_metrics_plot_and_eval(tmp_path: Path, model_dir: Path) -> None:
    cfg = _config(tmp_path, model_dir)
    assert main(["train", str(cfg)]) == 0
    out = tmp_path / "out"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("train/loss" in r and "eval/avg_total_reward" in r for r in rows)
    assert (out / "training_curve.png").read_bytes()[:4] == b"\x89PNG"
    final = json.loads((out / "eval" / "eval_step_2_summary.json").read_text())
    assert final["eval/num_episodes"] == 4.0
    # the Trainer's evaluations are filed by step; the one at the last step is the run's final one, not repeated
    names = sorted(p.name for p in (out / "eval").glob("*_summary.json"))
    assert names == [f"eval_step_{n}_summary.json" for n in (0, 1, 2)]
    assert final["step"] == 2 and final["eval/seconds"] == rows[1]["eval/seconds"]


def test_eval_prints_eval_stats(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, model_dir)
    assert main(["eval", str(cfg)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["eval/num_episodes"] == 4.0
    assert -1.0 <= stats["eval/avg_total_reward"] <= 1.0  # -1: a reply cut at max_tokens
    assert (tmp_path / "out" / "eval" / "eval_call_1.jsonl").is_file()
