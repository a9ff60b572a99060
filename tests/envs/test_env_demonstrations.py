"""Envs that provide demonstrations for an SFT warm start show only training rows, with correct answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": 5, "answer": "a"}, "prompt must be a string or a non-empty list"),
        ({"prompt": True, "answer": "a"}, "prompt must be a string or a non-empty list"),
        ({"prompt": "q", "answer": "a", "tools": 5}, "tools must be a list of tool schemas"),
        ({"prompt": [{"role": 5, "content": "q"}], "answer": "a"}, r"prompt\[0\] must be .* string role"),
        ({"prompt": [{"role": "user", "content": 5}], "answer": "a"}, r"prompt\[0\].content must be a string"),
        ({"prompt": "q", "answer": " \n\t"}, "answer must be a non-empty string"),
        ({"prompt": "q", "answer": "a\ud800"}, "answer is not valid Unicode text"),
        ({"prompt": "q\udfff", "answer": "a"}, "prompt is not valid Unicode text"),
    ],
)
def test_hostile_fields_are_a_value_error_naming_the_field(kwargs: dict, message: str) -> None:
    """Each of these used to pass (or raise a bare TypeError) and only fail, unlocated, in the tokenizer."""
    with pytest.raises(ValueError, match=message):
        Demonstration(**kwargs)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(prompt=st.text(min_size=1) | _json, answer=st.text(min_size=1) | _json, tools=st.none() | _json)
@example(prompt=5, answer="a", tools=None)
@example(prompt="q", answer="a", tools=True)
@example(prompt=[{"role": "user", "content": ["x"]}], answer="a", tools=None)
def test_any_json_fields_give_a_demonstration_or_a_value_error(prompt: object, answer: object, tools: object) -> None:
    """Whatever a JSONL row holds, the reader can name the row: only ValueError escapes."""
    try:
        d = Demonstration(prompt, answer, tools)  # type: ignore[arg-type]
    except ValueError:
        return
    assert isinstance(d.answer, str) and d.answer.strip()
    assert isinstance(d.prompt, str) or all(isinstance(m["role"], str) for m in d.prompt)
