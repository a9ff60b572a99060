"""Running one tool call without blocking the event loop, and turning its result into a tool message.

A synchronous tool runs in a worker thread (``asyncio.to_thread``), so a slow tool never stalls the
other episodes on the loop and an episode's ``timeout_s`` fires on time. Python cannot stop a thread:
when the episode is cancelled the tool call is abandoned, its thread finishes in the background and
its result is dropped (``asyncio.run`` waits for such threads when it closes the loop).

A synchronous tool not marked ``concurrent`` runs one call at a time per event loop (as it did when it
ran on the loop thread), so tools that are not thread-safe stay safe. Async tools run on the loop.

Every failure becomes ``(message, True)`` for a tool message the model reads, never an exception: a
tool that raises (``SystemExit`` included: ``sys.exit()`` in a tool), and a result that cannot be written as JSON (a circular structure, one nested too
deeply, an object whose ``str`` raises).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import weakref
from collections.abc import Callable
from typing import Any

from ludic.agents.tools import Tool

_SERIAL_LOCKS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[int, tuple[Callable[..., Any], asyncio.Lock]]
] = weakref.WeakKeyDictionary()


async def run_tool(tool: Tool, arguments: dict[str, Any]) -> tuple[str, bool]:
    """``(content, error)`` for one call: the tool's result as text, or what went wrong."""
    try:
        result = await _call(tool, arguments)
    except (Exception, SystemExit) as exc:  # the model sees the failure and may retry; not silent
        # SystemExit too: a tool calling sys.exit() is a failing tool, not a request to end the run (raised
        # in a task, it would escape act() and stop the event loop, every other episode with it)
        return f"Error: tool {tool.name!r} raised {type(exc).__name__}: {exc}", True
    return tool_result_text(tool.name, result)


def tool_result_text(name: str, result: Any) -> tuple[str, bool]:
    """A string result as is, anything else as JSON; an unserialisable result is a tool error."""
    if isinstance(result, str):
        return result, False
    try:
        return json.dumps(result, default=str), False
    except (ValueError, TypeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {exc}"
        return f"Error: tool {name!r} returned a result that cannot be written as JSON ({why})", True


async def _call(tool: Tool, arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(tool.fn):
        return await tool.fn(**arguments)
    if tool.concurrent:
        result = await asyncio.to_thread(tool.fn, **arguments)
    else:
        async with _serial_lock(tool.fn):
            result = await asyncio.to_thread(tool.fn, **arguments)
    return await result if inspect.isawaitable(result) else result


def _serial_lock(fn: Callable[..., Any]) -> asyncio.Lock:
    """One lock per (event loop, tool function); the entry keeps ``fn`` alive so its id stays unique."""
    locks = _SERIAL_LOCKS.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(id(fn), (fn, asyncio.Lock()))[1]
