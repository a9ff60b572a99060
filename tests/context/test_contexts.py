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
