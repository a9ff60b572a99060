"""Judging a program against stdin/stdout test cases, outside the untrusted process.

The program only ever sees one test's stdin; its stdout comes back as bytes and is compared here,
so it cannot fake a pass (exiting 0 early prints nothing; overriding ``__eq__`` changes nothing
on this side). Runs go through a pool of ``pool_size`` slots; results are cached by the hash of
(code, tests, limits, runner), and identical requests in flight share one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic.envs.code_exec.compile_check import MAX_CODE_BYTES, compile_error, compile_error_bounded
from ludic.envs.code_exec.sandbox import CodeRunner, RunOutcome, SandboxLimits

__all__ = ["MAX_CODE_BYTES", "CodeExecResult", "CodeExecutor", "TestCase", "TestResult", "compile_error"]
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0/C1 controls but \\t and \\n, DEL, and the bidi overrides: a program's output must not drive the
terminal of whoever reads the logs (cursor moves, title changes, hidden text)."""


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``), newlines and tabs kept."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


@dataclass(frozen=True)
class TestCase:
    """One test: the program's stdin and the stdout it must print (compared line by line,
    trailing whitespace ignored)."""

    __test__ = False  # not a pytest class
    input: str
    output: str


@dataclass(frozen=True)
class TestResult:
    """``status``: passed, wrong_answer, or the run's failure (runtime_error, timeout, ...)."""

    __test__ = False
    status: str
    wall_s: float
    stdout_head: str = ""
    stderr_tail: str = ""


@dataclass(frozen=True)
class CodeExecResult:
    """Verdict on one program. ``failure_kinds``: the distinct statuses of failing tests."""

    compile_failed: bool
    tests: list[TestResult] = field(default_factory=list)
    compile_error: str = ""

    @property
    def num_passed(self) -> int:
        return sum(t.status == "passed" for t in self.tests)

    @property
    def pass_rate(self) -> float:
        return self.num_passed / len(self.tests) if self.tests else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and self.num_passed == len(self.tests)

    @property
    def failure_kinds(self) -> list[str]:
        kinds = {t.status for t in self.tests if t.status != "passed"}
        return sorted(kinds | ({"compile_error"} if self.compile_failed else set()))

    def info(self) -> dict[str, Any]:
        """The step info reducers read (``pass_rate``, ``all_passed``, ``compile_failed``, ...)."""
        first = next((t for t in self.tests if t.status != "passed"), None)
        return {
            "pass_rate": self.pass_rate,
            "all_passed": self.all_passed,
            "compile_failed": self.compile_failed,
            "num_tests": len(self.tests),
            "num_passed": self.num_passed,
            "failure_kinds": self.failure_kinds,
            "test_statuses": [t.status for t in self.tests],
            "first_failure": self.compile_error or (first.stderr_tail or first.status if first else ""),
        }


def outputs_match(actual: bytes, expected: str) -> bool:
    got = actual.decode("utf-8", errors="replace").strip().splitlines()
    want = expected.strip().splitlines()
    return [line.rstrip() for line in got] == [line.rstrip() for line in want]


class CodeExecutor:
    """Runs programs through ``runner`` with at most ``pool_size`` sandboxes at once."""

    def __init__(
        self,
        runner: CodeRunner,
        *,
        limits: SandboxLimits | None = None,
        pool_size: int = 4,
        cache_size: int = 4096,
        compile_timeout_s: float = 5.0,
    ) -> None:
        if not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be an int >= 1, got {pool_size!r}")
        if not 0 < compile_timeout_s < float("inf"):
            raise ValueError(f"compile_timeout_s must be finite and > 0, got {compile_timeout_s!r}")
        self.compile_timeout_s = compile_timeout_s
        self.runner = runner
        self.limits = limits or SandboxLimits()
        self.pool_size = pool_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, asyncio.Future[CodeExecResult]] = OrderedDict()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue[int]] = (
            weakref.WeakKeyDictionary()
        )
        self.runs = 0  # sandbox runs actually started (cache hits start none)

    def cache_key(self, code: str, tests: list[TestCase]) -> str:
        blob = json.dumps([code, [[t.input, t.output] for t in tests], vars(self.limits), self.runner.name])
        return hashlib.sha256(blob.encode()).hexdigest()

    async def evaluate(self, code: str, tests: list[TestCase]) -> tuple[CodeExecResult, bool]:
        """(the verdict, whether it came from the cache)."""
        key = self.cache_key(code, tests)
        cached = self._cache.get(key)
        loop = asyncio.get_running_loop()
        if cached is not None and (cached.done() or cached.get_loop() is loop):
            self._cache.move_to_end(key)
            return await asyncio.shield(cached), True
        future: asyncio.Future[CodeExecResult] = loop.create_future()
        self._cache[key] = future
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        try:
            result = await self._evaluate(code, tests)
        except BaseException as exc:
            self._cache.pop(key, None)
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        future.set_result(result)
        return result, False

    async def _evaluate(self, code: str, tests: list[TestCase]) -> CodeExecResult:
        async with self._slot():  # a child process compiles (compile_check): a compile bomb blocks nothing
            error = await compile_error_bounded(code, timeout_s=self.compile_timeout_s)
        if error:
            return CodeExecResult(compile_failed=True, compile_error=printable(error))
        with tempfile.TemporaryDirectory(prefix="ludic-code-") as tmp:
            os.chmod(tmp, 0o755)  # readable by the sandbox's unprivileged uid, writable by no one there
            path = Path(tmp) / "solution.py"
            path.write_text(code, encoding="utf-8")
            path.chmod(0o644)
            results = await asyncio.gather(*(self._run_test(Path(tmp), t) for t in tests))
        return CodeExecResult(compile_failed=False, tests=list(results))

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[int]:
        """One of the ``pool_size`` slots of this event loop, held for the block."""
        slots = self._slots.get(asyncio.get_running_loop())
        if slots is None:  # one pool per event loop (asyncio queues belong to one loop)
            slots = self._slots[asyncio.get_running_loop()] = asyncio.Queue()
            for slot in range(self.pool_size):
                slots.put_nowait(slot)
        slot = await slots.get()
        try:
            yield slot
        finally:
            slots.put_nowait(slot)

    async def _run_test(self, code_dir: Path, test: TestCase) -> TestResult:
        async with self._slot() as slot:
            self.runs += 1
            outcome = await self.runner.run(code_dir, test.input.encode(), self.limits, slot=slot)
        return _judge(outcome, test)


def _judge(outcome: RunOutcome, test: TestCase) -> TestResult:
    if outcome.status != "ok":
        status = outcome.status
    else:
        status = "passed" if outputs_match(outcome.stdout, test.output) else "wrong_answer"
    return TestResult(
        status=status,
        wall_s=outcome.wall_s,
        stdout_head=printable(outcome.stdout[:200].decode("utf-8", errors="replace")),
        stderr_tail=printable(outcome.stderr[-500:].decode("utf-8", errors="replace")),
    )
