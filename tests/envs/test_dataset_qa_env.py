import pytest

from ludic.envs import DatasetQAEnv, gsm8k_target_parser, normalize_answer


def test_question_is_the_observation_and_agent_is_agent_0():
    env = DatasetQAEnv({"question": "2+2?", "answer": "4"})
    assert env.agent_ids == ["agent_0"]
    assert env.reset(seed=3) == {"agent_0": ("2+2?", {"target_answer": "4"})}


def test_correct_answer_gets_reward_one_and_info():
    env = DatasetQAEnv({"question": "q", "answer": "Tom paid 1,200.\n#### 1,200"}, gsm8k_target_parser)
    env.reset()
    out = env.step({"agent_0": " 1200.0 "})["agent_0"]
    assert (out.reward, out.terminated, out.obs) == (1.0, True, None)
    assert out.info == {"correct": True, "parsed_answer": "1200", "target_answer": "1,200"}


def test_wrong_answer_gets_zero():
    env = DatasetQAEnv({"question": "q", "answer": "4"})
    env.reset()
    out = env.step({"agent_0": "five"})["agent_0"]
    assert (out.reward, out.info["correct"], out.info["parsed_answer"]) == (0.0, False, "five")


def test_missing_field_names_the_key():
    with pytest.raises(KeyError, match="no 'answer' field"):
        DatasetQAEnv({"question": "q", "solution": "4"})


def test_custom_keys_and_system_prompt():
    env = DatasetQAEnv(
        {"prompt": "p", "target": "Paris"},
        question_key="prompt",
        answer_key="target",
        system_prompt="Answer briefly.",
    )
    assert env.suggested_sysprompt == "Answer briefly."
    env.reset()
    assert env.step({"agent_0": "paris."})["agent_0"].reward == 1.0


def test_second_answer_without_reset_raises():
    env = DatasetQAEnv({"question": "q", "answer": "4"})
    env.reset()
    env.step({"agent_0": "4"})
    with pytest.raises(RuntimeError, match="already answered"):
        env.step({"agent_0": "4"})


def test_normalize_answer_compares_numbers_by_value():
    assert [normalize_answer(x) for x in ["$3", "3.0", "-2.50", " A  b "]] == ["3", "3", "-2.5", "a b"]
