"""End to end: the quickstart command leaves metrics JSONL, a PNG, a loadable checkpoint and a summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.training.run_outputs import claim_outputs

pytestmark = pytest.mark.integration


def test_quickstart_few_steps_leaves_all_artefacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qs"
    argv = [
        "quickstart",
        "--steps",
        "3",
        "--sft-steps",
        "2",
        "--eval-episodes",
        "8",
        "--eval-every",
        "2",
        "--group-size",
        "4",
        "--prompts-per-step",
        "2",
        "--output-dir",
        str(out),
        "--no-live",
    ]
    # an earlier run's metrics (claimed, as a run claims its outputs): the quickstart starts over
    claim_outputs([out / "metrics.jsonl"], out)
    (out / "metrics.jsonl").write_text('{"step": 7, "train/loss": 1.0}\n')
    assert main(argv) == 0
    screen = capsys.readouterr().out
    assert "ludic quickstart: starting over; removed" in screen

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    assert all(0.0 <= r["train/avg_total_reward"] <= 1.0 for r in train_rows)
    assert any("eval/avg_total_reward" in r for r in rows)  # the Trainer ran the evaluator at step 2

    assert (out / "training_curve.png").read_bytes()[:4] == b"\x89PNG"

    from transformers import AutoModelForCausalLM

    summary = json.loads((out / "summary.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(summary["paths"]["model"])
    assert sum(p.numel() for p in model.parameters()) > 100_000
    assert 0.0 <= summary["eval_before_rl"] <= 1.0 and 0.0 <= summary["eval_after"] <= 1.0
    assert summary["rl_gain"] == pytest.approx(summary["eval_after"] - summary["eval_before_rl"])
    names = {p.name for p in (out / "eval").glob("*_summary.json")}
    # before SFT (-1), start of RL (0), the Trainer's eval at step 2, end (3)
    assert names == {"eval_step_-1_summary.json", "eval_step_0_summary.json", "eval_step_2_summary.json",
                     "eval_step_3_summary.json"}  # fmt: skip

    assert "held-out evaluation" in screen and "gain from RL" in screen
