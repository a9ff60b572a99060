import pytest

from ludic.agents import ReActAgent, ToolAgent
from ludic.context import FullDialog
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def boom() -> str:
    """Always fails."""
    raise ValueError("no power")


async def lookup(key: str) -> str:
    """Async tool."""
    return {"capital": "Paris"}[key]


def _call(name, args):
    import json

    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def _agent(cls=ToolAgent, *, client=None, tools=None, **kw):
    return cls(
        client=client or ScriptedChatClient([]),
        model="m",
        ctx=FullDialog(system_prompt="Be exact."),
        parser=xml_tag_parser("answer"),
        tools=[add, boom, lookup] if tools is None else tools,
        **kw,
    )


def _tool_agent(replies, cls=ToolAgent, **kw):
    client = ScriptedChatClient(replies)
    agent = _agent(cls, client=client, **kw)
    agent.on_env_reset("What is 2+3?", {})
    return agent, client


async def test_tool_call_runs_and_its_result_is_a_tool_message_before_the_final_answer():
    agent, client = _tool_agent([_call("add", {"a": 2, "b": 3}), "<answer>5</answer>"])
    parse, info = await agent.act()
    assert parse.action == "5"
    assert info["tool_calls"] == [
        {"id": "call_0", "name": "add", "arguments": {"a": 2, "b": 3}, "output": "5", "error": False}
    ]
    assert info["raw_text"] == "<answer>5</answer>"
    assert len(info["tool_traces"]) == 1
    assert info["trace"].completion_token_ids == list(b"<answer>5</answer>")
    assert client.requests[1].messages[-2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"},
    ]
    assert client.requests[0].tools[0]["function"]["name"] == "add"
    assert agent.ctx.messages[-1] == {"role": "assistant", "content": "<answer>5</answer>"}


async def test_tool_instructions_go_into_the_sent_system_message_only():
    agent, client = _tool_agent(["<answer>1</answer>"])
    await agent.act()
    sent = client.requests[0].messages[0]["content"]
    assert sent.startswith(
        "Be exact.\n\nYou can call these tools:\n- add(a: int, b: int) -> int: Add two integers."
    )
    assert '<tool_call>{"name": "<tool name>"' in sent
    assert agent.ctx.messages[0] == {"role": "system", "content": "Be exact."}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (_call("mul", {}), "Error: unknown tool 'mul'. Available tools: ['add', 'boom', 'lookup']"),
        (_call("boom", {}), "Error: tool 'boom' raised ValueError: no power"),
        (_call("add", {"a": 1}), "Error: tool 'add' raised TypeError:"),
    ],
)
async def test_tool_failures_become_tool_messages_and_the_loop_continues(body, expected):
    agent, client = _tool_agent([body, "<answer>ok</answer>"])
    parse, info = await agent.act()
    assert parse.action == "ok"
    assert info["tool_calls"][0]["error"] is True
    assert info["tool_calls"][0]["output"].startswith(expected)
    assert client.requests[1].messages[-1]["role"] == "tool"
    assert client.requests[1].messages[-1]["content"].startswith(expected)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("<tool_call>{not json}</tool_call>", "Error: invalid JSON in tool call (Expecting property name"),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "Error: 'arguments' must be a JSON object"),
    ],
)
async def test_a_call_that_cannot_be_read_is_answered_by_a_user_message_not_an_orphan_tool_message(body, expected):
    """Before, it got a tool message whose ``tool_call_id`` no assistant message listed (and the assistant
    message an empty ``tool_calls``): OpenAI-compatible APIs refuse that history with a 400."""
    agent, client = _tool_agent([body, "<answer>ok</answer>"])
    parse, info = await agent.act()
    assert parse.action == "ok"
    assert info["tool_calls"][0]["error"] is True and info["tool_calls"][0]["output"].startswith(expected)
    call_reply, told = client.requests[1].messages[-2:]
    assert call_reply == {"role": "assistant", "content": body}  # what the model wrote, no tool_calls key
    assert told["role"] == "user"
    assert told["content"].startswith("Your tool call could not be read, so it did not run. " + expected)


async def test_a_reply_with_a_readable_and_an_unreadable_call_lists_and_answers_only_the_readable_one():
    body = _call("add", {"a": 2, "b": 3}) + "<tool_call>{oops}</tool_call>"
    agent, client = _tool_agent([body, "<answer>5</answer>"])
    _, info = await agent.act()
    assert [(c["id"], c["error"]) for c in info["tool_calls"]] == [("call_0", False), ("call_1", True)]
    reply, result, told = client.requests[1].messages[-3:]
    assert reply["content"] == "<tool_call>{oops}</tool_call>"  # the unreadable block stays as written
    assert [c["id"] for c in reply["tool_calls"]] == ["call_0"]
    assert result == {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"}
    assert told["role"] == "user" and "invalid JSON in tool call" in told["content"]


async def test_async_tools_are_awaited():
    agent, _ = _tool_agent([_call("lookup", {"key": "capital"}), "<answer>Paris</answer>"])
    _, info = await agent.act()
    assert info["tool_calls"][0]["output"] == "Paris"


async def test_tool_agent_takes_the_reply_after_max_tool_rounds_as_final():
    agent, client = _tool_agent([_call("add", {"a": 1, "b": 1}), _call("add", {"a": 2, "b": 2})])
    parse, info = await agent.act()
    assert len(client.requests) == 2
    assert [c["output"] for c in info["tool_calls"]] == ["2"]
    assert parse.action is None  # the parser rejects a tool call as the final answer


async def test_react_agent_loops_up_to_max_react_steps_then_forces_a_final_answer():
    replies = [_call("add", {"a": i, "b": 1}) for i in range(3)] + ["<answer>3</answer>"]
    agent, client = _tool_agent(replies, cls=ReActAgent, max_react_steps=2)
    parse, info = await agent.act()
    assert parse.action == "3"
    assert [c["output"] for c in info["tool_calls"]] == ["1", "2"]
    assert len(client.requests) == 4
    assert client.requests[3].messages[-1] == {
        "role": "user",
        "content": "You have used all 2 tool steps. Give your final answer now, without tool calls.",
    }
    assert len(info["tool_traces"]) == 3


async def test_react_agent_stops_as_soon_as_a_reply_has_no_tool_call():
    agent, client = _tool_agent([_call("add", {"a": 1, "b": 2}), "<answer>3</answer>"], cls=ReActAgent)
    parse, _ = await agent.act()
    assert parse.action == "3" and len(client.requests) == 2


def test_bad_tool_config_is_rejected():
    with pytest.raises(TypeError, match="tool 'x' is not callable"):
        _agent(tools={"x": 3})
    with pytest.raises(ValueError, match="max_react_steps must be an int >= 1"):
        _agent(ReActAgent, max_react_steps=0)


async def test_several_calls_in_one_reply_run_in_order_with_their_ids():
    reply = _call("add", {"a": 1, "b": 1}) + _call("mul", {}) + _call("add", {"a": 2, "b": 2})
    agent, client = _tool_agent([reply, "<answer>4</answer>"])
    _, info = await agent.act()
    assert [(c["id"], c["output"][:6]) for c in info["tool_calls"]] == [
        ("call_0", "2"),
        ("call_1", "Error:"),
        ("call_2", "4"),
    ]
    tool_msgs = client.requests[1].messages[-3:]
    assert [(m["role"], m["tool_call_id"], m["name"]) for m in tool_msgs] == [
        ("tool", "call_0", "add"),
        ("tool", "call_1", "mul"),
        ("tool", "call_2", "add"),
    ]


async def test_structured_tool_calls_from_the_server_are_used_when_present():
    from ludic.types import ChatResponse

    class StructuredClient(ScriptedChatClient):
        async def complete(self, request):
            response, info = await super().complete(request)
            if len(self.requests) == 1:
                entry = {
                    "id": "srv-1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'},
                }
                response = ChatResponse(**{**vars(response), "tool_calls": [entry]})
            return response, info

    client = StructuredClient(["calling", "<answer>9</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[add]
    )
    agent.on_env_reset("q", {})
    parse, info = await agent.act()
    assert parse.action == "9"
    assert info["tool_calls"][0] == {
        "id": "srv-1",
        "name": "add",
        "arguments": {"a": 4, "b": 5},
        "output": "9",
        "error": False,
    }
    assert client.requests[1].messages[-2]["content"] == "calling"
    assert client.requests[1].messages[-1]["tool_call_id"] == "srv-1"


async def test_calls_run_concurrently_only_when_every_tool_allows_it():
    import asyncio

    from ludic.agents.tools import Tool

    started = {"ping": asyncio.Event(), "pong": asyncio.Event()}

    async def ping() -> str:
        started["ping"].set()
        await asyncio.wait_for(started["pong"].wait(), 2)  # needs pong running at the same time
        return "ping"

    async def pong() -> str:
        started["pong"].set()
        await asyncio.wait_for(started["ping"].wait(), 2)
        return "pong"

    tools = [Tool.from_callable(ping, concurrent=True), Tool.from_callable(pong, concurrent=True)]
    client = ScriptedChatClient([_call("ping", {}) + _call("pong", {}), "<answer>x</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=tools
    )
    agent.on_env_reset("q", {})
    _, info = await agent.act()
    assert [c["output"] for c in info["tool_calls"]] == ["ping", "pong"]

    for e in started.values():
        e.clear()
    sequential = [Tool.from_callable(ping), Tool.from_callable(pong, concurrent=True)]
    client = ScriptedChatClient([_call("ping", {}) + _call("pong", {}), "<answer>x</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=sequential
    )
    agent.on_env_reset("q", {})
    _, info = await agent.act()
    assert info["tool_calls"][0]["output"].startswith("Error: tool 'ping' raised TimeoutError")


async def test_a_sync_tool_runs_off_the_event_loop():
    import asyncio
    import threading

    released = threading.Event()

    def wait_for_loop() -> str:
        """Returns once the event loop has run a task meanwhile."""
        return "released" if released.wait(2) else "loop was blocked"

    async def release_soon():
        await asyncio.sleep(0.05)
        released.set()

    client = ScriptedChatClient([_call("wait_for_loop", {}), "<answer>x</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[wait_for_loop]
    )
    agent.on_env_reset("q", {})
    (_, info), _ = await asyncio.gather(agent.act(), release_soon())
    assert info["tool_calls"][0]["output"] == "released"


async def test_an_episode_timeout_fires_on_time_while_a_sync_tool_runs():
    import asyncio
    import threading
    import time

    from ludic.envs import SingleAgentEnv
    from ludic.interaction import SingleAgentProtocol
    from ludic.types import StepOutcome

    class OneShot(SingleAgentEnv):
        suggested_sysprompt = None

        def env_reset(self, *, seed=None):
            return "q", {}

        def env_current_obs(self):
            return "q"

        def env_step(self, action):
            return StepOutcome(obs="done", reward=1.0, truncated=False, terminated=True, info={})

    finish = threading.Event()

    def slow() -> str:
        """Takes up to 3 s."""
        finish.wait(3)
        return "late"

    client = ScriptedChatClient([_call("slow", {}), "<answer>x</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[slow]
    )
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timeout_s=0\.5"):
        await SingleAgentProtocol(agent=agent).run(env=OneShot(), max_steps=1, timeout_s=0.5)
    elapsed = time.monotonic() - start
    finish.set()  # let the abandoned worker thread end now rather than at 3 s
    await asyncio.sleep(0)
    assert elapsed < 1.5


async def test_sync_tools_not_marked_concurrent_never_overlap_across_agents():
    import asyncio
    import threading
    import time

    running, overlaps = [0], []
    guard = threading.Lock()

    def counter() -> str:
        """Not thread-safe on purpose: records any overlap."""
        with guard:
            running[0] += 1
            overlaps.append(running[0] > 1)
        time.sleep(0.05)
        with guard:
            running[0] -= 1
        return "ok"

    agents = []
    for _ in range(3):
        client = ScriptedChatClient([_call("counter", {}), "<answer>x</answer>"])
        agent = ToolAgent(
            client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[counter]
        )
        agent.on_env_reset("q", {})
        agents.append(agent)
    results = await asyncio.gather(*(a.act() for a in agents))
    assert [info["tool_calls"][0]["output"] for _, info in results] == ["ok"] * 3
    assert overlaps == [False, False, False]


async def test_a_result_that_cannot_be_written_as_json_is_a_tool_error_message():
    def circular() -> dict:
        """Returns a dict that contains itself."""
        d: dict = {}
        d["self"] = d
        return d

    client = ScriptedChatClient([_call("circular", {}), "<answer>ok</answer>"])
    agent = ToolAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[circular]
    )
    agent.on_env_reset("q", {})
    parse, info = await agent.act()
    assert parse.action == "ok"
    expected = "Error: tool 'circular' returned a result that cannot be written as JSON (ValueError: Circular"
    assert info["tool_calls"][0]["error"] is True
    assert info["tool_calls"][0]["output"].startswith(expected)
    assert client.requests[1].messages[-1]["role"] == "tool"
    assert client.requests[1].messages[-1]["content"].startswith(expected)
