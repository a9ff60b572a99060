import pytest

from ludic.context import FullDialog, TruncatedThinkingContext, strip_thinking
from ludic.types import ChatResponse


def _play(ctx):
    ctx.on_env_reset("board 1", {})
    ctx.on_after_act(ChatResponse(text="<think>take center</think> <move>5</move>"))
    ctx.on_after_step("board 2", {})


def test_full_dialog_sends_the_whole_history_in_order():
    ctx = FullDialog(system_prompt="Play well.")
    _play(ctx)
    assert ctx.on_before_act() == [
        {"role": "system", "content": "Play well."},
        {"role": "user", "content": "board 1"},
        {"role": "assistant", "content": "<think>take center</think> <move>5</move>"},
        {"role": "user", "content": "board 2"},
    ]


def test_reset_clears_history_and_can_replace_the_system_prompt():
    ctx = FullDialog(system_prompt="A")
    _play(ctx)
    ctx.reset()
    assert ctx.messages == [{"role": "system", "content": "A"}]
    ctx.reset(system_prompt="B")
    assert ctx.messages == [{"role": "system", "content": "B"}]
    assert ctx.system_prompt == "B"


def test_on_after_step_with_no_observation_records_nothing():
    ctx = FullDialog()
    ctx.on_after_step(None, {})
    assert ctx.messages == []


def test_append_message_records_tool_results():
    ctx = FullDialog()
    ctx.append_message({"role": "tool", "name": "add", "content": "3"})
    assert ctx.on_before_act() == [{"role": "tool", "name": "add", "content": "3"}]


def test_truncated_thinking_strips_think_from_earlier_turns_only_in_the_prompt():
    ctx = TruncatedThinkingContext()
    _play(ctx)
    assert ctx.on_before_act()[1] == {"role": "assistant", "content": "<move>5</move>"}
    assert ctx.messages[1]["content"] == "<think>take center</think> <move>5</move>"


def test_truncated_thinking_leaves_user_messages_alone_and_uses_placeholder():
    ctx = TruncatedThinkingContext(placeholder="[thought] ")
    ctx.on_env_reset("<think>not mine</think> q", {})
    ctx.on_after_act(ChatResponse(text="<think>a</think>x<think>b</think>y"))
    prompt = ctx.on_before_act()
    assert prompt[0]["content"] == "<think>not mine</think> q"
    assert prompt[1]["content"] == "[thought] x[thought] y"


def test_strip_thinking_handles_multiline_blocks():
    assert strip_thinking("<think>a\nb</think>\n\nanswer") == "answer"


def test_recent_messages_sends_the_system_prompt_and_the_last_messages_only() -> None:
    from ludic.context import RecentMessages
    from ludic.types import ChatResponse

    ctx = RecentMessages(keep=1, system_prompt="rules")
    ctx.on_env_reset("board 1", {})
    ctx.on_after_act(ChatResponse(text="<move>5</move>"))
    ctx.on_after_step("board 2", {})
    assert ctx.on_before_act() == [{"role": "system", "content": "rules"}, {"role": "user", "content": "board 2"}]
    assert len(ctx.messages) == 4  # the full history is still recorded
    two = RecentMessages(keep=2)
    two.on_env_reset("a", {})
    two.on_after_act(ChatResponse(text="x"))
    two.on_after_step("b", {})
    assert [m["content"] for m in two.on_before_act()] == ["x", "b"]
    with pytest.raises(ValueError, match="keep must be an int >= 1"):
        RecentMessages(keep=0)


def _tool_round(ctx) -> None:
    """What ToolAgent records for a reply calling two tools: the calls, then one result per call."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "add", "arguments": {"a": i, "b": 1}}}
        for i in range(2)
    ]
    ctx.append_message({"role": "assistant", "content": "", "tool_calls": calls})
    for i in range(2):
        result = {"role": "tool", "tool_call_id": f"call_{i}", "name": "add", "content": str(i + 1)}
        ctx.append_message(result)


def test_recent_messages_never_sends_tool_results_without_the_call_they_answer() -> None:
    from ludic.context import RecentMessages

    for keep in (1, 2):
        ctx = RecentMessages(keep=keep, system_prompt="rules")
        ctx.on_env_reset("What is 0+1 and 1+1?", {})
        _tool_round(ctx)
        prompt = ctx.on_before_act()
        # was [system, tool] (keep=1): a tool message with no assistant tool call before it
        assert [m["role"] for m in prompt] == ["system", "assistant", "tool", "tool"]
        assert prompt[1:] == ctx.messages[2:]
    three = RecentMessages(keep=3)
    three.on_env_reset("q", {})
    _tool_round(three)
    assert [m["role"] for m in three.on_before_act()] == ["assistant", "tool", "tool"]  # already whole
    three.on_after_act(ChatResponse(text="<answer>1, 2</answer>"))
    three.on_after_step("next", {})
    # the last 3 would start at the second tool result: widened back to the call
    assert [m["role"] for m in three.on_before_act()] == ["assistant", "tool", "tool", "assistant", "user"]


async def test_tool_agent_with_recent_messages_asks_again_with_the_call_and_its_result() -> None:
    from ludic.agents import ToolAgent
    from ludic.context import RecentMessages
    from ludic.parsers import xml_tag_parser
    from ludic.testing.scripted_client import ScriptedChatClient

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    client = ScriptedChatClient([call, "<answer>5</answer>"])
    agent = ToolAgent(
        client=client,
        model="m",
        ctx=RecentMessages(keep=1, system_prompt="Be exact."),
        parser=xml_tag_parser("answer"),
        tools=[add],
    )
    agent.on_env_reset("What is 2+3?", {})
    parse, _ = await agent.act()
    assert parse.action == "5"
    second = client.requests[1].messages
    assert [m["role"] for m in second] == ["system", "assistant", "tool"]  # was ["system", "tool"]
    assert second[1]["tool_calls"][0]["id"] == second[2]["tool_call_id"] == "call_0"


@pytest.mark.parametrize("make", ["FullDialog", "RecentMessages", "TruncatedThinkingContext"])
def test_changing_returned_messages_never_changes_the_history(make: str) -> None:
    import copy

    import ludic.context

    ctx = getattr(ludic.context, make)(system_prompt="rules")
    ctx.on_env_reset("q", {})
    _tool_round(ctx)
    recorded = copy.deepcopy(ctx.messages)
    for messages in (ctx.messages, ctx.on_before_act()):
        messages[-1]["content"] += " (edited)"  # was: the recorded tool result changed
        messages[-3]["tool_calls"][0]["function"]["arguments"]["a"] = 99
        messages[-3]["tool_calls"].append({"id": "extra"})
    assert ctx.messages == recorded
    sent = {"role": "tool", "tool_call_id": "call_9", "name": "add", "content": "x", "extra": [1]}
    ctx.append_message(sent)
    sent["extra"].append(2)  # the caller's dict stays the caller's
    assert ctx.messages[-1]["extra"] == [1]


def test_thinking_tags_are_stripped_in_any_case_as_think_prefix_parser_reads_them() -> None:
    from ludic.parsers import think_prefix_parser

    reply = "<Think>take center</Think> <move>5</move>"
    assert strip_thinking(reply) == "<move>5</move>"  # was left whole
    assert strip_thinking("<THINK>a</think>b<think>c</THINK> d") == "bd"
    assert think_prefix_parser()(reply).action == "<move>5</move>"
    ctx = TruncatedThinkingContext()
    ctx.on_env_reset("board", {})
    ctx.on_after_act(ChatResponse(text=reply))
    assert ctx.on_before_act()[1]["content"] == "<move>5</move>"
