"""The ``dataset_qa`` kind over a data-set file: rows by env seed, held-out rows apart from training rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.envs import DatasetQAEnv, DatasetRowsEnv
from ludic.envs.dataset_rows import split_rows
from ludic.registry import ENV_REGISTRY


def _jsonl(path: Path, n: int, *, q: str = "question", a: str = "answer") -> Path:
    path.write_text("".join(json.dumps({q: f"{i} + 1 = ?", a: str(i + 1)}) + "\n" for i in range(n)))
    return path


def _questions(env: DatasetRowsEnv) -> set[str]:
    return {env.reset(seed=s)["agent_0"][0] for s in range(len(env.rows))}


def test_env_seed_picks_the_row_and_the_reward_compares_answers(tmp_path: Path) -> None:
    env = ENV_REGISTRY.build("dataset_qa", path=str(_jsonl(tmp_path / "d.jsonl", 3)))
    assert env.reset(seed=4)["agent_0"][0] == "1 + 1 = ?"  # 4 % 3 = row 1
    assert env.step({"agent_0": "2"})["agent_0"].reward == 1.0
    env.reset(seed=2)
    assert env.step({"agent_0": "2"})["agent_0"].reward == 0.0  # row 2 wants 3


def test_held_out_fraction_keeps_eval_rows_apart_from_training_rows(tmp_path: Path) -> None:
    path = str(_jsonl(tmp_path / "d.jsonl", 10))
    train = ENV_REGISTRY.build("dataset_qa", path=path, held_out_fraction=0.3)
    held = ENV_REGISTRY.build("dataset_qa", path=path, held_out_fraction=0.3, split="eval")
    assert (len(train.rows), len(held.rows)) == (7, 3)
    assert not _questions(train) & _questions(held)
    assert len(_questions(train) | _questions(held)) == 10


def test_held_out_path_serves_the_eval_split(tmp_path: Path) -> None:
    train = str(_jsonl(tmp_path / "train.jsonl", 4))
    test = tmp_path / "test.jsonl"
    test.write_text(json.dumps({"question": "held out?", "answer": "yes"}) + "\n")
    env = ENV_REGISTRY.build("dataset_qa", path=train, held_out_path=str(test), split="eval")
    assert _questions(env) == {"held out?"}


def test_parquet_rows_with_named_fields(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    path = tmp_path / "d.parquet"
    datasets.Dataset.from_list([{"q": "2 + 2?", "a": "4"}]).to_parquet(str(path))
    env = ENV_REGISTRY.build("dataset_qa", path=str(path), question_key="q", answer_key="a")
    assert env.reset(seed=0)["agent_0"][0] == "2 + 2?"
    assert env.step({"agent_0": " 4 "})["agent_0"].reward == 1.0


def test_a_fixed_sample_still_builds_the_plain_env() -> None:
    env = ENV_REGISTRY.build("dataset_qa", sample={"question": "q", "answer": "a"}, split="eval")
    assert type(env) is DatasetQAEnv and env.reset(seed=9)["agent_0"][0] == "q"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "eval"}, "split 'eval' needs held-out rows"),
        ({"held_out_fraction": 0.01}, "leaves no held-out rows"),
        ({"held_out_fraction": 0.5, "held_out_path": "x.jsonl"}, "not both"),
        ({"question_key": "prompt"}, r"row 0 of .* has no \['prompt'\] field"),
        ({"split": "test"}, "split must be 'train' or 'eval'"),
        ({"target_format": "latex"}, "target_format must be one of"),
    ],
)
def test_bad_arguments_say_what_to_fix(tmp_path: Path, kwargs: dict, message: str) -> None:
    path = str(_jsonl(tmp_path / "d.jsonl", 5))
    with pytest.raises((ValueError, KeyError), match=message):
        ENV_REGISTRY.build("dataset_qa", path=path, **kwargs)


def test_missing_file_and_wrong_suffix_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        ENV_REGISTRY.build("dataset_qa", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"is not a \.jsonl, \.json or \.parquet file"):
        ENV_REGISTRY.build("dataset_qa", path=str(tmp_path / "rows.csv"))
    with pytest.raises(ValueError, match="exactly one of sample"):
        ENV_REGISTRY.build("dataset_qa")


def test_split_rows_is_seeded_and_keeps_file_order() -> None:
    rows = [{"i": i} for i in range(6)]
    train, held = split_rows(rows, 0.5, seed=1)
    assert (train, held) == split_rows(rows, 0.5, seed=1)
    assert [r["i"] for r in train] == sorted(r["i"] for r in train)
    assert sorted(r["i"] for r in train + held) == list(range(6))
