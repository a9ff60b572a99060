"""The quickstart task: prompt-dependent answers and a dense, bounded reward."""

from __future__ import annotations

import pytest

from ludic.envs.letter_repeat import LetterRepeatEnv, letter_for_seed, letter_repeat_reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("qqqq", 1.0),
        (" qqqq\n", 1.0),  # surrounding whitespace is ignored
        ("qqq", 0.75),
        ("qqqqqq", 4 / 6),  # extra characters cost credit
        ("qxqq", 0.75),
        ("aaaa", 0.0),
        ("", 0.0),
    ],
)
def test_reward_counts_matching_positions(completion: str, expected: float) -> None:
    assert letter_repeat_reward(completion, "q", 4) == pytest.approx(expected)


def test_letter_is_a_deterministic_function_of_the_seed() -> None:
    assert letter_for_seed(7) == letter_for_seed(7)
    letters = {letter_for_seed(s) for s in range(200)}
    assert len(letters) == 26  # all letters are used, so ignoring the prompt scores ~1/26


def test_constant_policy_scores_near_chance() -> None:
    rewards = [letter_repeat_reward("eeee", letter_for_seed(s), 4) for s in range(1000)]
    assert sum(rewards) / len(rewards) < 0.08


def test_env_episode_is_one_step_with_prompt_naming_the_letter() -> None:
    env = LetterRepeatEnv(count=3)
    (obs, info) = env.reset(seed=5)["agent_0"]
    letter = letter_for_seed(5)
    assert obs == f"Repeat {letter} 3 times."
    assert info == {"letter": letter, "target": letter * 3}
    outcome = env.step({"agent_0": letter * 3})["agent_0"]
    assert outcome.reward == 1.0
    assert outcome.terminated is True
    assert outcome.obs is None
    assert outcome.info["correct"] is True


def test_env_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        LetterRepeatEnv(count=0)
    with pytest.raises(ValueError, match="distinct characters"):
        LetterRepeatEnv(letters="aab")
