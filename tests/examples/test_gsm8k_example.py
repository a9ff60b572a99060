"""examples/gsm8k: the local dataset, its env, and an end-to-end train + eval smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

GSM8K = Path(__file__).resolve().parents[2] / "examples" / "gsm8k"
sys.path.insert(0, str(GSM8K))

from gsm8k_env import GSM8KEnv, last_number  # noqa: E402
from make_data import final_answer, read_dataset, write_dataset  # noqa: E402


def test_dataset_is_deterministic_and_gsm8k_formatted(tmp_path: Path) -> None:
    a = read_dataset(write_dataset(tmp_path / "a.jsonl", n=5, seed=3))
    b = read_dataset(write_dataset(tmp_path / "b.jsonl", n=5, seed=3))
    assert a == b
    assert all("####" in row["answer"] for row in a)
    assert final_answer("2 + 3 = 5\n#### 5") == "5"
    assert final_answer("#### 1,234") == "1234"


def test_last_number_takes_the_final_number() -> None:
    assert last_number("3 + 4 = 7, so the answer is 7.") == "7"
    assert last_number("about 1,200 apples") == "1200"
    assert last_number("no idea") is None


def test_env_rewards_the_right_final_number(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"question": "Ana has 2 pens and finds 3 more. How many?", "answer": "2 + 3 = 5\n#### 5"})
        + "\n"
    )
    env = GSM8KEnv(path=str(path))
    obs, info = env.reset(seed=7)["agent_0"]
    assert obs == "Ana has 2 pens and finds 3 more. How many?"
    assert info == {"target_answer": "5"}
    right = env.step({"agent_0": "2 + 3 = 5"})["agent_0"]
    assert (right.reward, right.terminated, right.info["correct"]) == (1.0, True, True)
    env.reset(seed=0)
    wrong = env.step({"agent_0": "6"})["agent_0"]
    assert (wrong.reward, wrong.info["parsed_answer"], wrong.info["target_answer"]) == (0.0, "6", "5")


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.slow  # two example processes: ~15 s
def test_train_and_eval_scripts_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    common = ["--output-dir", str(out), "--eval-episodes", "4", "--max-new-tokens", "8"]
    train = subprocess.run(
        [
            sys.executable,
            str(GSM8K / "train_gsm8k.py"),
            "--steps",
            "2",
            "--group-size",
            "2",
            "--prompts-per-step",
            "2",
            *common,
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert (out / "training_curve.png").is_file()
    summaries = sorted((out / "eval").glob("*_summary.json"))
    assert summaries, "evaluation wrote no summary"
    stats = json.loads(summaries[-1].read_text())
    assert stats["eval/num_episodes"] == 4.0
    assert -1.0 <= stats["eval/avg_total_reward"] <= 1.0  # -1: a reply cut at max_tokens
