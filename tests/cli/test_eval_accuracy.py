"""``eval/accuracy``: the held-out fraction of steps the env judged ``correct``, beside the mean reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.testing.run_config import tiny_run_toml


def test_eval_accuracy_is_the_fraction_of_correct_episodes(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(tiny_run_toml(model_dir, steps=0, tables=(
        f'[eval]\nnum_episodes = 6\nsampling = {{ temperature = 1.0, max_tokens = 2 }}\n'
        f'[logging]\noutput_dir = "{tmp_path / "out"}"\n'
    )))  # fmt: skip
    assert main(["eval", str(config)]) == 0
    stats = json.loads(capsys.readouterr().out)
    episodes = [json.loads(line) for line in (tmp_path / "out" / "eval" / "eval_call_1.jsonl").open()]
    correct = [float(e["steps"][0]["info"]["correct"]) for e in episodes]
    assert len(correct) == 6 and stats["eval/accuracy"] == pytest.approx(sum(correct) / 6)


def test_envs_that_judge_nothing_report_no_accuracy() -> None:
    from ludic.eval.records import step_records
    from ludic.training.stats import Reducer, apply_reducers_to_records
    from ludic.types import Rollout, Step

    rollout = Rollout(steps=[Step(0, "obs", "act", None, 1.0, False, True, info={"score": 1.0})])
    accuracy = {"accuracy": Reducer(kind="mean", source="correct", transform=float)}
    assert apply_reducers_to_records(step_records([rollout]), accuracy) == {}
