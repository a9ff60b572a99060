"""A tool calling ``sys.exit()`` is a failing tool (issue 37): the model reads the error, ``act`` goes on."""

from __future__ import annotations

import asyncio
import sys

import pytest

from ludic.agents import ToolAgent
from ludic.context import FullDialog
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient


def quit_now() -> str:
    """Exits the process."""
    sys.exit(3)


async def quit_async() -> str:
    """Exits from a coroutine."""
    raise SystemExit("bye")


CALL = '<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


@pytest.mark.parametrize(("tool", "message"), [(quit_now, "SystemExit: 3"), (quit_async, "SystemExit: bye")])
async def test_a_tool_raising_system_exit_is_a_tool_error_and_the_episode_continues(tool, message):
    client = ScriptedChatClient([CALL.format(name=tool.__name__), "<answer>done</answer>"])
    agent = ToolAgent(
        client=client,
        model="m",
        ctx=FullDialog(system_prompt="s"),
        parser=xml_tag_parser("answer"),
        tools=[tool],
    )
    agent.on_env_reset("go", {})
    parse, info = await agent.act()
    assert parse.action == "done"
    (call,) = info["tool_calls"]
    assert call["error"] is True and call["output"] == f"Error: tool {tool.__name__!r} raised {message}"
    assert client.requests[1].messages[-1]["content"] == call["output"]
    # the loop is still alive: other tasks on it run
    assert await asyncio.sleep(0, result="alive") == "alive"
