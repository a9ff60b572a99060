import pytest

from ludic.envs import DatasetQAEnv, gsm8k_target_parser, normalize_answer


def test_question_is_the_observation_and_agent_is_agent_0():
    env = DatasetQAEnv({"question": "2+2?", "answer": "4"})
    assert env.agent_ids == ["agent_0"]
    qid = env.question_id
    assert qid.startswith("q-") and len(qid) == 18
    assert env.reset(seed=3) == {"agent_0": ("2+2?", {"target_answer": "4", "question_id": qid})}
    assert DatasetQAEnv({"question": "2+2?", "answer": "4"}).question_id == qid  # stable across envs
    assert DatasetQAEnv({"id": 17, "question": "2+2?", "answer": "4"}).question_id == "17"


def test_correct_answer_gets_reward_one_and_info():
    env = DatasetQAEnv({"question": "q", "answer": "Tom paid 1,200.\n#### 1,200"}, gsm8k_target_parser)
    env.reset()
    out = env.step({"agent_0": " 1200.0 "})["agent_0"]
    assert (out.reward, out.terminated, out.obs) == (1.0, True, None)
    assert out.info == {
        "correct": True,
        "answer_found": True,
        "parsed_answer": "1200",
        "target_answer": "1,200",
        "question_id": env.question_id,
    }


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


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("12345678901234567890", "12345678901234567891", False),  # floats would call these equal
        ("9" * 400, "1e400", False),
        ("1" + "0" * 400, "1e400", True),
        ("1e999999", "1e999998", False),  # floats would make both inf
        ("0.1", ".1", True),
        ("-0", "0", True),
        ("1.50", "1.5", True),
        ("2.5e-3", "0.0025", True),
    ],
)
def test_numbers_compare_exactly(a, b, same):
    assert (normalize_answer(a) == normalize_answer(b)) is same


def test_a_missing_answer_never_matches_the_string_none():
    env = DatasetQAEnv({"question": "q", "answer": None})
    env.reset()
    out = env.step({"agent_0": "None"})["agent_0"]
    assert out.reward == 0.0 and out.info["correct"] is False and out.info["target_answer"] is None
    env = DatasetQAEnv({"question": "q", "answer": ""})
    env.reset()
    assert env.step({"agent_0": ""})["agent_0"].info["correct"] is False


@pytest.mark.parametrize(
    "text",
    ["1" * 1_000_000, "1" * 1_000_000 + "x", "1." + "1" * 1_000_000 + "e", "-" + "0" * 999_999 + "1", " ," * 500_000],
)
def test_answer_normalisation_is_linear_on_megabyte_inputs(text):
    import time

    started = time.perf_counter()
    normalize_answer(text)
    assert time.perf_counter() - started < 10.0  # the old float regex took minutes on "1"*1e6 + "x"
