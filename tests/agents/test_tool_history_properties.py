"""The dialog a ToolAgent sends stays valid for OpenAI-compatible APIs whatever the model's calls hold.

Invariant, over replies mixing readable calls, unknown tools and unreadable calls (text blocks or the
server's structured ``tool_calls``): every ``tool`` message answers a call listed in the assistant message
just before its run of tool messages, each listed call is answered exactly once, no assistant message
carries an empty ``tool_calls``, and every call the reply made shows up in ``info["tool_calls"]``. Before,
an unreadable call got a tool message whose id no assistant message listed (a 400 from such APIs).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.agents import ToolAgent
from ludic.context import FullDialog
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.types import ChatResponse


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


_readable = st.builds(lambda a, b: {"name": "add", "arguments": {"a": a, "b": b}}, st.integers(), st.integers())
_unknown = st.just({"name": "mul", "arguments": {}})
_unreadable_text = st.sampled_from(["{oops}", '{"arguments": {}}', '{"name": "add", "arguments": [1]}', "[]", "7"])
_unreadable_args = st.sampled_from(["{oops", "[1, 2]", "NaN", '{"a": Infinity}'])
_text_call = _readable.map(json.dumps) | _unknown.map(json.dumps) | _unreadable_text
_structured_call = (
    _readable.map(lambda c: {"name": c["name"], "arguments": json.dumps(c["arguments"])})
    | _unknown.map(lambda c: {"name": c["name"], "arguments": "{}"})
    | _unreadable_args.map(lambda a: {"name": "add", "arguments": a})
)
_text_reply = st.lists(_text_call, min_size=1, max_size=4).map(
    lambda calls: "".join(f"<tool_call>{c}</tool_call>" for c in calls)
)
_structured_reply = st.lists(_structured_call, min_size=1, max_size=4).map(
    lambda calls: [{"id": f"srv_{i}", "type": "function", "function": f} for i, f in enumerate(calls)]
)


class StructuredClient(ScriptedChatClient):
    """Replies whose calls come as the server's ``tool_calls`` (text otherwise), as a parsing server sends."""

    def __init__(self, replies: list[Any]) -> None:
        super().__init__([r if isinstance(r, str) else "" for r in replies])
        self.calls = [None if isinstance(r, str) else r for r in replies]

    async def complete(self, request):
        response, info = await super().complete(request)
        calls = self.calls[len(self.requests) - 1]
        return (ChatResponse(**{**response.__dict__, "tool_calls": calls}) if calls else response), info


def _check_dialog(messages: list[dict[str, Any]]) -> None:
    listed: set[str] = set()
    answered: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            assert m.get("tool_calls", None) != [], m
            if m.get("tool_calls"):
                assert answered >= listed, messages  # the calls before were all answered
                listed = {c["id"] for c in m["tool_calls"]}
                answered = set()
        elif m["role"] == "tool":
            before = messages[i - 1]["role"]
            assert before in ("assistant", "tool"), messages  # a run of tool messages right after the calls
            assert m["tool_call_id"] in listed and m["tool_call_id"] not in answered, messages
            answered.add(m["tool_call_id"])
    assert answered >= listed, messages


@settings(max_examples=60, deadline=None)
@given(st.lists(_text_reply | _structured_reply, min_size=1, max_size=3))
def test_every_tool_message_answers_a_listed_call_whatever_the_calls_hold(replies) -> None:
    client = StructuredClient([*replies, "<answer>done</answer>"])
    agent = ToolAgent(client=client, model="m", ctx=FullDialog(system_prompt="s"), parser=xml_tag_parser("answer"),
                      tools=[add], max_tool_rounds=len(replies))  # fmt: skip
    agent.on_env_reset("q", {})
    parse, info = asyncio.run(agent.act())
    assert parse.action == "done"
    for request in client.requests:
        _check_dialog(request.messages)
    made = sum(len(r) if isinstance(r, list) else r.count("<tool_call>") for r in replies)
    assert len(info["tool_calls"]) == made  # every call, readable or not, is in the log
