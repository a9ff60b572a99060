import asyncio
import time

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs.code_exec import (
    BubblewrapRunner,
    CodeExecEnv,
    CodeExecutor,
    SandboxLimits,
    SandboxUnavailableError,
    TestCase,
    extract_code,
    make_runner,
)
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient

PROBLEM = {
    "id": "double",
    "prompt": "Read an integer n and print 2*n.",
    "tests": [{"input": "3\n", "output": "6\n"}, {"input": "-4\n", "output": "-8"}, {"input": "0", "output": "0"}],
}
LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2)


@pytest.fixture(scope="module")
def runner():
    return BubblewrapRunner()


def _identity(text: str) -> ParseResult:
    return ParseResult(action=text)


async def _play(reply: str, executor: CodeExecutor):
    agent = Agent(client=ScriptedChatClient([reply]), model="m", ctx=FullDialog(), parser=_identity)
    env = CodeExecEnv(PROBLEM, executor=executor)
    (rollout,) = await SingleAgentProtocol(agent).run(env=env, max_steps=1)
    return rollout.steps[0]


async def test_a_correct_program_scores_one_and_reports_for_reducers(runner):
    executor = CodeExecutor(runner, limits=LIMITS, pool_size=2)
    step = await _play("Here:\n```python\nprint(2 * int(input()))\n```\n", executor)
    assert step.reward == 1.0
    assert {k: step.info[k] for k in ("pass_rate", "all_passed", "compile_failed", "failure_kinds", "cached")} == {
        "pass_rate": 1.0,
        "all_passed": True,
        "compile_failed": False,
        "failure_kinds": [],
        "cached": False,
    }
    assert step.info["problem_id"] == "double"


async def test_partial_and_failing_programs_report_their_failure_kinds(runner):
    executor = CodeExecutor(runner, limits=LIMITS, pool_size=2)
    step = await _play("```python\nn = int(input())\nprint(2 * n if n > 0 else 1 // n)\n```", executor)
    assert step.reward == pytest.approx(1 / 3)
    assert step.info["test_statuses"] == ["passed", "wrong_answer", "runtime_error"]
    assert step.info["failure_kinds"] == ["runtime_error", "wrong_answer"]
    assert "ZeroDivisionError" in step.info["first_failure"] or step.info["first_failure"] == "wrong_answer"
    step = await _play("```python\ndef f(:\n```", executor)
    assert step.reward == 0.0 and step.info["compile_failed"] is True
    assert step.info["failure_kinds"] == ["compile_error"] and "SyntaxError" in step.info["first_failure"]
    assert executor.runs == 3  # a compile failure starts no sandbox


async def test_results_are_cached_by_code_and_tests_and_shared_in_flight(runner):
    executor = CodeExecutor(runner, limits=LIMITS, pool_size=2)
    code, tests = "print(2 * int(input()))", [TestCase("5", "10")]
    results = await asyncio.gather(*(executor.evaluate(code, tests) for _ in range(4)))
    assert executor.runs == 1
    assert [cached for _, cached in results] == [False, True, True, True]
    await executor.evaluate(code, [TestCase("6", "12")])
    assert executor.runs == 2


async def test_runs_are_concurrent_up_to_the_pool_size(runner):
    in_flight, peak = 0, 0

    class Counting:
        name = "counting-bubblewrap"

        async def run(self, code_dir, stdin, limits, *, slot):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await runner.run(code_dir, stdin, limits, slot=slot)
            finally:
                in_flight -= 1

    executor = CodeExecutor(Counting(), limits=LIMITS, pool_size=2)
    code = "import time\ntime.sleep(0.3)\nprint(input())"
    await asyncio.gather(*(executor.evaluate(code, [TestCase(str(i), str(i))]) for i in range(5)))
    assert peak == 2 and executor.runs == 5


def test_without_bubblewrap_untrusted_code_is_refused_unless_opted_out_by_name(tmp_path):
    with pytest.raises(SandboxUnavailableError, match="choose runner='unsandboxed' by name"):
        BubblewrapRunner(bwrap="/bin/false")
    with pytest.raises(ValueError, match="unknown code runner 'docker'"):
        make_runner("docker")
    assert make_runner("unsandboxed").name == "unsandboxed"


async def test_the_unsandboxed_runner_runs_only_when_named():
    executor = CodeExecutor(make_runner("unsandboxed"), limits=LIMITS)
    result, _ = await executor.evaluate("print(int(input()) + 1)", [TestCase("1", "2")])
    assert result.all_passed


def test_extract_code_takes_the_last_fenced_block_in_linear_time():
    assert extract_code("a\n```python\nx=1\n```\nb\n```py\ny=2\n```") == "y=2\n"
    assert extract_code("print(1)") == "print(1)"
    started = time.perf_counter()
    extract_code("```python\n" * 100_000 + "```")
    extract_code("`" * 1_000_000)
    assert time.perf_counter() - started < 10.0  # linear: well under 1 s; quadratic would take minutes


def test_concurrent_runs_never_share_a_sandbox_uid_even_across_processes():
    import subprocess
    import sys

    from ludic.envs.code_exec.bwrap import claimed_uid

    with claimed_uid(70000, 0) as a, claimed_uid(70000, 0) as b:
        assert a != b  # same slot asked twice: the second gets the next free uid
        other = subprocess.run(
            [sys.executable, "-c", "from ludic.envs.code_exec.bwrap import claimed_uid\n"
             "with claimed_uid(70000, 0) as u: print(u)"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert int(other.stdout) not in (a, b)
    with claimed_uid(70000, 0) as again:
        assert again == a  # released on exit
