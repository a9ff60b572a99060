import asyncio
import json

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs.math_qa import MathGrader, MathQAEnv, grade, gsm8k_env, load_qa_rows
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "Half of 1?", "answer": "#### 0.5"},
]


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(workers=1)
    yield g
    g.close()


@pytest.mark.parametrize(
    ("answer", "target", "correct"),
    [
        ("so the answer is \\boxed{7}", "7", True),
        ("#### 7", "7", True),
        ("The answer is 7.0", "7", True),
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{1/2}", "\\frac{1}{2}", True),
        ("\\boxed{8}", "7", False),
        ("\\boxed{12345678901234567891}", "12345678901234567890", False),
        ("None", "7", False),
        ("", "7", False),
    ],
)
def test_math_verify_grades_numeric_and_symbolic_equivalence(answer, target, correct):
    assert grade(answer, target)[0] is correct


async def test_math_qa_env_rewards_a_boxed_answer_and_reports_the_question_id(grader):
    agent = Agent(
        client=ScriptedChatClient(["3 plus 4 is \\boxed{7}."]),
        model="m",
        ctx=FullDialog(),
        parser=lambda t: ParseResult(t),
    )
    env = gsm8k_env(ROWS, 0, grader=grader)
    (rollout,) = await SingleAgentProtocol(agent).run(env=env, max_steps=1)
    step = rollout.steps[0]
    assert step.reward == 1.0
    assert step.info["correct"] is True and step.info["grade_error"] is None
    assert step.info["target_answer"] == "7" and step.info["question_id"] == env.question_id


async def test_grading_runs_off_the_event_loop(grader):
    await grader.grade("\\boxed{1}", "1")  # worker started
    env = MathQAEnv(ROWS[1], grader=grader)
    env.reset()
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    outcome = (await env.astep({"agent_0": "\\boxed{\\frac{2}{4}}"}))["agent_0"]
    done.set()
    await task
    assert outcome.reward == 1.0
    assert ticks > 1  # other coroutines ran while the answer was being graded


def test_a_row_without_an_answer_is_never_correct():
    env = MathQAEnv({"question": "q", "answer": None})
    env.reset()
    out = env.step({"agent_0": "None"})["agent_0"]
    assert out.reward == 0.0 and out.info["grade_error"] == "no target answer"


@pytest.mark.slow  # importing datasets + building its cache: ~6 s
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_gsm8k_rows_load_from_local_jsonl_and_parquet(tmp_path, suffix):
    path = tmp_path / f"gsm8k{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    rows = load_qa_rows(path)
    assert rows == ROWS
    env = gsm8k_env(rows, 3)
    assert env.reset()["agent_0"][0] == ROWS[1]["question"]


def test_load_qa_rows_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file .*missing\.jsonl"):
        load_qa_rows(tmp_path / "missing.jsonl")
