"""The code_exec example: its problems' reference solutions pass in the sandbox, and the training
loop runs with the sandbox in it."""

import importlib.util
from pathlib import Path

import pytest

from ludic.envs.code_exec import BubblewrapRunner, CodeExecutor, TestCase

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code_exec" / "train_code_exec.py"


def _module():
    spec = importlib.util.spec_from_file_location("train_code_exec", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
async def test_every_shipped_problem_is_solved_by_its_reference_solution_and_not_by_a_wrong_one():
    problems = _module().load_problems()
    assert len(problems) == 12
    executor = CodeExecutor(BubblewrapRunner(), pool_size=4)
    for p in problems:
        tests = [TestCase(t["input"], t["output"]) for t in p["tests"]]
        good, _ = await executor.evaluate(p["solution"], tests)
        assert good.all_passed, (p["id"], good)
        bad, _ = await executor.evaluate("print(0)", tests)
        assert not bad.all_passed, p["id"]


@pytest.mark.slow
async def test_code_exec_example_trains_one_step_with_the_sandbox_in_the_loop():
    stats = await _module().main(steps=1, group_size=2, prompts_per_step=2, max_tokens=16)
    assert stats["train/num_samples"] == 4.0
    assert stats["train/all_passed_rate"] == 0.0  # a random tiny model writes no working program
    assert "train/compile_fail_rate" in stats
