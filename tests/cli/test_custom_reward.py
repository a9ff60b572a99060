"""``[env].reward = "module:function"``: the user's own reward for ``dataset_qa``, keeping its held-out split
and demonstrations; ``--dry-run`` imports the function and scores a first row with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_qa_run_config

pytestmark = pytest.mark.integration

REWARDS = '''
def length_score(reply, target, row):
    """A score exact match cannot give: the reply's length over the row's own scale."""
    return len(reply) / row["scale"]


def needs_two(reply, target):
    return 0.0


def says_yes(reply, target, row):
    return "yes"


def raises(reply, target, row):
    raise RuntimeError("the grader is down")
'''


def _config(tmp_path: Path, model: Path, reward: str, *, tables: str = "", name: str = "dataset_qa") -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"question": f"say {c}", "answer": "zz", "scale": 10}) + "\n" for c in "ab"))
    test.write_text(json.dumps({"question": "held out", "answer": "zz", "scale": 100}) + "\n")
    config = write_qa_run_config(tmp_path / "run.toml", model, train=train, test=test, steps=1, max_tokens=3,
                                 plot=False, tables=f"[trainer]\nmax_seq_len = 128\n{tables}")  # fmt: skip
    text = config.read_text().replace('name = "dataset_qa"', f'name = "{name}"\nreward = "{reward}"')
    config.write_text(text)
    return config


def test_the_users_reward_scores_training_and_held_out_episodes(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path.parent)  # the module is found next to the config, not in the current folder
    config = _config(tmp_path, model_dir, "my_rewards:length_score",
                     tables="[sft]\nsteps = 1\nbatch_size = 2\nfrom_env = true\n")  # fmt: skip
    assert main(["train", str(config)]) == 0
    out = tmp_path / "out"
    episodes = [json.loads(x) for x in (out / "eval" / "eval_step_1.jsonl").read_text().splitlines()]
    assert episodes and all(e["steps"][0]["prev_obs"] == "held out" for e in episodes)  # the held-out row
    for e in episodes:  # scale 100: the held-out row's own field reached the function
        assert e["total_reward"] == pytest.approx(len(e["steps"][0]["action"]) / 100)
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["train/avg_total_reward"] > 0.0  # exact match against "zz" would give 0 to an untrained model


@pytest.mark.parametrize(
    ("reward", "name", "message"),
    [
        ("no_such_module:score", "dataset_qa", "cannot import 'no_such_module'"),
        ("my_rewards:missing", "dataset_qa", "module 'my_rewards' has no function 'missing'"),
        ("my_rewards:needs_two", "dataset_qa", "must take (reply, target, row)"),
        ("my_rewards:says_yes", "dataset_qa", "returned 'yes'; it must return a finite number"),
        ("my_rewards:raises", "dataset_qa", "RuntimeError: the grader is down"),
        ("my_rewards:length_score", "letter_repeat", "env 'letter_repeat' takes no reward function"),
        ("length_score", "dataset_qa", "reward must be 'module:function'"),
    ],
)
def test_the_dry_run_refuses_a_reward_that_cannot_score(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], reward: str, name: str, message: str
) -> None:
    config = _config(tmp_path, model_dir, reward, name=name)
    if name == "letter_repeat":
        config.write_text(re.sub(r"kwargs = \{ path.*\}", "kwargs = { count = 2 }", config.read_text()))
    assert main(["train", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and ("[env]" in err)
