"""reasoning-gym data sets as envs, with the real package: scoring, held-out prompts, errors."""

from __future__ import annotations

import builtins
import sys

import pytest

from ludic.envs import ReasoningGymEnv
from ludic.envs.reasoning_gym_env import reasoning_gym_rows
from ludic.registry import ENV_REGISTRY

pytest.importorskip("reasoning_gym")

LETTERS = {"min_words": 3, "max_words": 5}


def test_correct_answer_scores_one_and_a_wrong_one_zero() -> None:
    env = ReasoningGymEnv("letter_counting", config=LETTERS, size=5, eval_size=2, seed=3)
    question, info = env.reset(seed=0)["agent_0"]
    assert question.startswith("How many times does the letter")
    assert info["question_id"] == "0"
    right = env.step({"agent_0": env.target_answer})["agent_0"]
    assert (right.reward, right.info["correct"], right.info["dataset"]) == (1.0, True, "letter_counting")
    env.reset(seed=0)
    assert env.step({"agent_0": "many"})["agent_0"].reward == 0.0


def test_reward_is_the_data_sets_own_score_answer() -> None:
    import reasoning_gym

    env = ENV_REGISTRY.build("reasoning_gym", dataset="basic_arithmetic", size=4, eval_size=2, seed=7)
    reference = reasoning_gym.create_dataset("basic_arithmetic", size=6, seed=7)
    for seed in range(4):
        env.reset(seed=seed)
        reply = f"x{env.target_answer}"  # partial credit in the default score_answer
        expected = reference.score_answer(answer=reply, entry=reference[seed])
        assert env.step({"agent_0": reply})["agent_0"].reward == pytest.approx(expected)
        assert 0.0 < expected < 1.0


def test_held_out_prompts_are_never_training_prompts() -> None:
    # letter_counting with 1-word spans repeats questions often: the held-out split must drop those
    config = {"min_words": 1, "max_words": 1}
    _, train, held = reasoning_gym_rows("letter_counting", config=config, size=200, eval_size=100, seed=0)
    train_q = {r["question"] for r in train}
    assert held and not train_q & {r["question"] for r in held}
    assert len(held) < 100  # some generated held-out items did repeat a training question
    assert {r["id"] for r in held} <= set(range(200, 300))  # indices after the training ones
    env = ReasoningGymEnv("letter_counting", config=config, size=200, eval_size=100, split="eval")
    assert env.reset(seed=1_000_000)["agent_0"][0] not in train_q


def test_unknown_data_set_and_bad_config_are_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="'no_such_task' not registered"):
        ReasoningGymEnv("no_such_task", size=2, eval_size=1)
    with pytest.raises(TypeError, match="bogus"):
        ReasoningGymEnv("letter_counting", config={"bogus": 1}, size=2, eval_size=1)
    with pytest.raises(ValueError, match="give seed as the env's own 'seed' argument"):
        ReasoningGymEnv("letter_counting", config={"seed": 1}, size=2, eval_size=1)
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        ReasoningGymEnv("letter_counting", split="test", size=2, eval_size=1)


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_reasoning_gym(name: str, *args: object, **kwargs: object) -> object:
        if name == "reasoning_gym":
            raise ImportError("No module named 'reasoning_gym'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "reasoning_gym", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_reasoning_gym)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[reasoning-gym\]'"):
        reasoning_gym_rows("letter_counting", size=3, eval_size=1, seed=12345)
