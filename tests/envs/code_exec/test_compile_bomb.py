"""A program that takes seconds to compile stalls no other episode, and its compile is bounded (issue 37).

``compile()`` holds the GIL, so compiling in a worker thread still stopped the event loop: thousands of
module-level list comprehensions (well under the 256 KB program limit) took seconds on the host before
the sandbox ran anything. The executor now compiles in a child process under ``compile_timeout_s``.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from ludic.envs.code_exec import CodeExecutor, SandboxLimits, TestCase, make_runner
from ludic.envs.code_exec.compile_check import compile_error, compile_error_bounded


def _comprehensions(n: int) -> str:
    return "b = []\n" + "x = [a for a in b]\n" * n + "print(2 * int(input()))\n"


async def _largest_stall(work) -> tuple[object, float]:
    """``await work``'s result and the longest the event loop went without running a 10 ms ticker, from
    just before ``work`` starts to just after it ends (a loop stalled throughout shows one long gap)."""
    times, stop = [], asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            times.append(time.monotonic())
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.03)  # ticking before the work starts
    try:
        result = await work
    finally:
        times.append(time.monotonic())
        stop.set()
        await ticker
    return result, max(b - a for a, b in itertools.pairwise(times))


async def test_a_slow_compile_does_not_stall_the_event_loop():
    for n in (3000, 6000, 12000):  # ~57 KB: ~0.3-0.8 s to compile here; grown until it costs > 0.3 s
        code = _comprehensions(n)
        started = time.monotonic()
        assert compile_error(code) == ""  # in-process: the cost the loop used to pay
        in_process = time.monotonic() - started
        if in_process > 0.3:
            break
    executor = CodeExecutor(
        make_runner("unsandboxed"), limits=SandboxLimits(wall_s=10.0, cpu_s=5), compile_timeout_s=60
    )
    (result, cached), stall = await _largest_stall(executor.evaluate(code, [TestCase("4", "8")]))
    assert (result.compile_failed, result.pass_rate, cached) == (False, 1.0, False)
    assert in_process > 0.3 and stall < in_process / 2, (in_process, stall)


async def test_a_compile_bomb_is_cut_off_at_the_bound_and_reported():
    executor = CodeExecutor(make_runner("unsandboxed"), compile_timeout_s=0.5)
    started = time.monotonic()
    (result, _), stall = await _largest_stall(executor.evaluate(_comprehensions(13000), [TestCase("1", "2")]))
    assert time.monotonic() - started < 5.0 and stall < 0.4
    assert (
        result.compile_failed and result.compile_error == "compiling took longer than 0.5 s (a compile bomb?)"
    )
    assert executor.runs == 0  # no sandbox started


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("def f(:\n", "SyntaxError: invalid syntax (solution.py, line 1)"),
        ("x = " + "(" * 300 + ")" * 300, "SyntaxError: too many nested parentheses (solution.py, line 1)"),
        ("print('ok')\n", ""),
        ("x = '\\N{no such name}'\n", None),
        ("a" * (256 * 1024 + 1), "program longer than 262144 bytes"),
    ],
)
async def test_the_child_gives_the_in_process_verdict(code, error):
    got = await compile_error_bounded(code, timeout_s=30)
    assert got == compile_error(code)
    if error is not None:
        assert got == error


def test_the_bound_must_be_positive_and_finite():
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="compile_timeout_s must be finite and > 0"):
            CodeExecutor(make_runner("unsandboxed"), compile_timeout_s=bad)
