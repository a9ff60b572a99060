"""Envs that provide demonstrations for an SFT warm start show only training rows, with correct answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.envs import DatasetRowsEnv, dataset_qa_env
from ludic.envs.demonstrations import Demonstration, ProvidesDemonstrations


def test_dataset_rows_demonstrations_are_a_seeded_cycle_of_answered_rows() -> None:
    rows = [
        {"question": "q0", "answer": "a0"},
        {"question": "q1", "answer": None},
        {"question": "q2", "answer": "a2"},
    ]
    env = DatasetRowsEnv(rows)
    assert isinstance(env, ProvidesDemonstrations)
    demos = env.demonstrations(5, seed=0)
    assert len(demos) == 5 and all(isinstance(d, Demonstration) for d in demos)
    assert {(d.prompt, d.answer) for d in demos} == {("q0", "a0"), ("q2", "a2")}  # the unanswered row: never
    assert {d.prompt for d in demos[:2]} == {"q0", "q2"}  # every row once before any repeats
    assert env.demonstrations(5, seed=0) == demos
    with pytest.raises(ValueError, match="n must be >= 1"):
        env.demonstrations(0, seed=0)


def test_dataset_qa_demonstrations_hold_no_held_out_row_and_use_the_parsed_target(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"work #### {i}"}) + "\n" for i in range(10))
    )
    kwargs = dict(path=str(path), held_out_fraction=0.3, target_format="gsm8k")
    held = {r["question"] for r in dataset_qa_env(split="eval", **kwargs).rows}
    demos = dataset_qa_env(**kwargs).demonstrations(20, seed=3)
    assert len(held) == 3 and not {d.prompt for d in demos} & held
    assert all(d.answer == d.prompt[1:] for d in demos)  # "q7" -> "7": the text after ####


def test_reasoning_gym_demonstrations_are_training_items_that_score_one() -> None:
    pytest.importorskip("reasoning_gym")
    from ludic.envs import ReasoningGymEnv

    kwargs = dict(config={"min_word_len": 3, "max_word_len": 3}, size=50, eval_size=20, seed=0)
    env = ReasoningGymEnv("spell_backward", **kwargs)
    held = {r["question"] for r in ReasoningGymEnv("spell_backward", split="eval", **kwargs).rows}
    by_question = {r["question"]: r["entry"] for r in env.rows}
    demos = env.demonstrations(30, seed=1)
    assert {d.prompt for d in demos} <= set(by_question) and not {d.prompt for d in demos} & held
    assert all(env.dataset.score_answer(answer=d.answer, entry=by_question[d.prompt]) == 1.0 for d in demos)


def test_a_demonstration_needs_a_prompt_and_a_non_empty_answer() -> None:
    with pytest.raises(ValueError, match="answer must be a non-empty string"):
        Demonstration("q", "")
    with pytest.raises(ValueError, match="prompt must be a string or a non-empty list"):
        Demonstration([], "a")
