"""Answer formats: an instruction in the prompt (apart from the system prompt) and an extractor in front of
the scorer, for dataset_qa and reasoning_gym; demonstrations say the answer in the same format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ludic.envs.answer_format import QuestionFormat, answer_extractor
from ludic.envs.dataset_qa_env import DatasetQAEnv


@pytest.mark.parametrize(
    ("spec", "reply", "expected"),
    [
        ("last_number", "7 + 5 = 12", "12"),
        ("last_number", "It is -3.5, I think.", "-3.5"),
        ("last_number", "no digits here", None),
        ("boxed", r"so \boxed{\frac{1}{2}} and \boxed{4}", "4"),
        ("boxed", r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        ("boxed", r"\boxed{unclosed", None),
        ("boxed", r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are content (as boxed_parser reads them)
        ("boxed", r"\boxed{a\}b}", r"a\}b"),
        ("boxed", r"\boxed{7} then \boxed{\}", None),  # the last box never closes
        ("tag:answer", "think <answer> 12 </answer> then <answer>13</answer>", "13"),
        ("tag:answer", "<answer>12", None),
        ("last_line", "work\n\n  12  \n", "12"),
        ("last_line", "   \n", None),
        ("after:The answer is", "The answer is 7. No, the answer is 8.\nThe answer is 9.", "9"),
        ("after:The answer is", "The answer is 12 apples\nbye", "12 apples"),
        ("after:The answer is", "7 + 5 = 12", None),
        ("after:Answer:", "Answer: .", None),
    ],
)
def test_extractors_read_the_last_answer_in_their_format(spec: str, reply: str, expected: str | None) -> None:
    assert answer_extractor(spec).extract(reply) == expected


@pytest.mark.parametrize("spec", ["last_number", "boxed", "tag:answer", "last_line", "after:The answer is"])
def test_a_written_answer_reads_back(spec: str) -> None:
    ex = answer_extractor(spec)
    assert ex.extract(ex.write("42")) == "42"


@pytest.mark.parametrize("spec", ["first_word", "tag:", "tag:a b", "tag:<x>", "after: ", "after:a\nb", 3])
def test_unknown_or_malformed_extractors_are_named(spec: object) -> None:
    with pytest.raises(ValueError, match="answer"):
        answer_extractor(spec)  # type: ignore[arg-type]


@given(st.text(max_size=300))
def test_extractors_never_raise_on_any_reply(reply: str) -> None:
    for spec in ("last_number", "boxed", "tag:answer", "last_line", "after:is"):
        out = answer_extractor(spec).extract(reply)
        assert out is None or (isinstance(out, str) and (out in reply or out.strip() in reply))


def test_question_format_renders_and_refuses_bad_layouts() -> None:
    assert QuestionFormat().render("2+2?") == "2+2?"
    assert QuestionFormat(instruction="Reply with the number.").render("2+2?") == "2+2? Reply with the number."
    assert QuestionFormat(question_template="Q: {question}\nA:").render("{x}+1?") == "Q: {x}+1?\nA:"
    for bad in (dict(question_template="no slot"), dict(question_template="{question}{question}"),
                dict(instruction="  "), dict(instruction="a", question_template="{question}")):  # fmt: skip
        with pytest.raises(ValueError):
            QuestionFormat(**bad)


def test_dataset_qa_asks_in_the_format_and_scores_the_extracted_answer() -> None:
    env = DatasetQAEnv(
        {"question": "What is 7 + 5?", "answer": "12"}, system_prompt=None,
        instruction="Put the answer in <answer></answer>.", answer="tag:answer",
    )  # fmt: skip
    obs, _ = env.reset()["agent_0"]
    assert obs == "What is 7 + 5? Put the answer in <answer></answer>."
    assert env.suggested_sysprompt is None  # the model's own default system prompt stays
    out = env.step({"agent_0": "7 + 5 = 12, so <answer>12</answer>"})["agent_0"]
    assert (out.reward, out.info["correct"], out.info["answer_found"]) == (1.0, True, True)
    env.reset()
    out = env.step({"agent_0": "7 + 5 = 12"})["agent_0"]  # right number, not in the asked format
    assert (out.reward, out.info["correct"], out.info["answer_found"]) == (0.0, False, False)


def test_dataset_qa_demonstrations_use_the_format(tmp_path) -> None:
    from ludic.envs.dataset_rows import dataset_qa_env

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(4)))
    env = dataset_qa_env(path=str(path), question_template="Q: {question}", answer="boxed")
    demos = env.demonstrations(4, seed=0)
    assert {d.prompt for d in demos} == {f"Q: {i}+1?" for i in range(4)}
    assert all(d.answer == f"\\boxed{{{int(d.prompt[3]) + 1}}}" for d in demos)


def test_reasoning_gym_scores_the_extracted_answer_with_its_own_scorer() -> None:
    from ludic.envs.reasoning_gym_env import ReasoningGymEnv

    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
              "allow_negation": False, "allow_parentheses": False}  # fmt: skip
    plain = ReasoningGymEnv("basic_arithmetic", config=config, size=8, eval_size=4)
    boxed = ReasoningGymEnv("basic_arithmetic", config=config, size=8, eval_size=4,
                            instruction="Put the answer in \\boxed{}.", answer="boxed")  # fmt: skip
    q_plain, _ = plain.reset(seed=1)["agent_0"]
    q_boxed, _ = boxed.reset(seed=1)["agent_0"]
    assert q_boxed == q_plain + " Put the answer in \\boxed{}."
    target = boxed.target_answer
    reply = f"{q_plain[len('Calculate '):-1]} = \\boxed{{{target}}}"
    assert plain.step({"agent_0": reply})["agent_0"].reward < 1.0  # partial credit on the whole reply
    out = boxed.step({"agent_0": reply})["agent_0"]
    assert (out.reward, out.info["parsed_answer"], out.info["answer_found"]) == (1.0, target, True)
    boxed.reset(seed=1)
    missing = boxed.step({"agent_0": f"the answer is {target}"})["agent_0"]
    assert (missing.reward, missing.info["answer_found"]) == (0.0, False)
    demo = boxed.demonstrations(1, seed=0)[0]
    assert demo.prompt.endswith(" Put the answer in \\boxed{}.") and demo.answer.startswith("\\boxed{")
