"""A single-step coding task: the model writes a Python program that reads stdin and prints the
answer; the reward is the fraction of hidden tests it passes, judged outside the sandbox."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ludic.envs.code_exec.bwrap import BubblewrapRunner
from ludic.envs.code_exec.executor import CodeExecutor, TestCase
from ludic.envs.code_exec.sandbox import CodeRunner, SandboxLimits
from ludic.envs.code_exec.unsandboxed import UnsandboxedRunner
from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.types import Info, Obs, StepOutcome

RUNNERS = ("bubblewrap", "unsandboxed")
SYSTEM_PROMPT = (
    "Write a complete Python 3 program that reads the input from stdin and prints the answer to stdout. "
    "Reply with the program only, in one ```python code block."
)
# possessive quantifiers (Python 3.11+): a run of blanks is never backtracked into, so each run is
# scanned once (the plain form backtracked quadratically: ``` + 131,072 spaces + ``` took 7 s)
_FENCE = re.compile(r"```[ \t]*+(?:python3?|py)?[ \t]*+\n")


def extract_code(text: str) -> str:
    """The last fenced code block (```python ... ```), else the whole reply. Linear time."""
    end = text.rfind("```")
    if end < 0:
        return text
    start = None
    for m in _FENCE.finditer(text, 0, end):
        start = m.end()
    return text if start is None else text[start:end]


def make_runner(name: str) -> CodeRunner:
    """``"bubblewrap"`` (the sandbox; raises SandboxUnavailableError where it cannot run) or
    ``"unsandboxed"`` (runs untrusted code on the host; only when chosen by name)."""
    if name == "bubblewrap":
        return BubblewrapRunner()
    if name == "unsandboxed":
        return UnsandboxedRunner()
    raise ValueError(f"unknown code runner {name!r}; choose one of {RUNNERS}")


_SHARED: dict[tuple[str, SandboxLimits, int], CodeExecutor] = {}
_SHARED_LOCK = threading.Lock()


def shared_executor(runner: str = "bubblewrap", *, limits: SandboxLimits | None = None, pool_size: int = 4) -> CodeExecutor:
    """One executor (pool + cache) per (runner, limits, pool size) in this process, so the envs of
    every episode share the pool and the cache."""
    key = (runner, limits or SandboxLimits(), pool_size)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = CodeExecutor(make_runner(runner), limits=key[1], pool_size=pool_size)
        return _SHARED[key]


class CodeExecEnv(SingleAgentEnv):
    """problem: ``{"prompt": str, "tests": [{"input": str, "output": str}, ...]}`` (+ optional ``"id"``).

    executor: the CodeExecutor to use; default ``shared_executor(runner)``.
    runner: ``"bubblewrap"`` (default) or ``"unsandboxed"`` (explicit opt-out of the sandbox).
    Reward: the pass rate in [0, 1]. Step info: ``pass_rate``, ``all_passed``, ``compile_failed``,
    ``failure_kinds``, ``test_statuses``, ``num_tests``, ``num_passed``, ``cached``, ``problem_id``.
    """

    def __init__(
        self,
        problem: Mapping[str, Any],
        *,
        executor: CodeExecutor | None = None,
        runner: str = "bubblewrap",
        system_prompt: str | None = SYSTEM_PROMPT,
    ) -> None:
        self.prompt, self.tests = _read_problem(problem)
        self.problem_id = problem.get("id")
        self.executor = executor if executor is not None else shared_executor(runner)
        self._system_prompt = system_prompt
        self._done = False

    @property
    def suggested_sysprompt(self) -> str | None:
        return self._system_prompt

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self._done = False
        return self.prompt, {"problem_id": self.problem_id, "num_tests": len(self.tests)}

    def env_current_obs(self) -> Obs:
        return self.prompt

    def env_step(self, action: str) -> StepOutcome:
        raise TypeError("CodeExecEnv runs programs asynchronously: call `await env.astep(...)` (protocols do)")

    async def env_astep(self, action: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("CodeExecEnv: the program was already judged; call reset()")
        self._done = True
        result, cached = await self.executor.evaluate(extract_code(action), self.tests)
        info = {**result.info(), "cached": cached, "problem_id": self.problem_id}
        return StepOutcome(obs=None, reward=result.pass_rate, truncated=False, terminated=True, info=info)


def _read_problem(problem: Mapping[str, Any]) -> tuple[str, list[TestCase]]:
    if not isinstance(problem, Mapping) or not isinstance(problem.get("prompt"), str):
        raise ValueError(f"CodeExecEnv: problem needs a 'prompt' string, got {problem!r:.120}")
    raw = problem.get("tests")
    if not isinstance(raw, Sequence) or not raw:
        raise ValueError(f"CodeExecEnv: problem {problem.get('id')!r} needs a non-empty 'tests' list")
    tests = []
    for i, t in enumerate(raw):
        if not isinstance(t, Mapping) or not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
            raise ValueError(f"CodeExecEnv: tests[{i}] must be {{'input': str, 'output': str}}, got {t!r:.120}")
        tests.append(TestCase(t["input"], t["output"]))
    return problem["prompt"], tests
