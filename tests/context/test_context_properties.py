"""Context strategies on any dialog: what they promise to keep is sent once, in order, and never changed.

Invariants: ``strip_thinking`` removes exactly the ``<think>...</think>`` blocks a lazy regex finds (tags in
any case, each opening with the first closing after it, and the whitespace after), in time linear in the
text; the prompt of ``FullDialog`` is the history, of ``RecentMessages`` the system prompt plus the last
``keep`` messages, widened back so that it never starts inside a tool exchange, of
``TruncatedThinkingContext`` the history with only assistant thinking removed; building a prompt never
changes the history, and changing a prompt or ``ctx.messages``, nested ``tool_calls`` included, never
changes it either.
"""

from __future__ import annotations

import copy
import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.context import FullDialog, RecentMessages, TruncatedThinkingContext, strip_thinking
from ludic.types import ChatResponse

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true

_pieces = st.sampled_from(
    ["<think>", "</think>", "<think", "think>", "<THINK>", "</Think>", " ", "\n", "\u2028", "\x85", "x"]
)
_texts = st.lists(_pieces | st.text(max_size=4), max_size=12).map("".join) | st.text(max_size=60)
_events = st.lists(
    st.tuples(st.sampled_from(["obs", "reply", "call", "tool", "end"]), _texts), max_size=8
)  # one episode's hooks after on_env_reset; "call" is an assistant message with tool_calls


def _reference_strip(text: str, placeholder: str) -> str:
    return re.sub(r"<think>.*?</think>\s*", lambda _: placeholder, text, flags=re.DOTALL | re.IGNORECASE)


@FAST
@given(_texts, st.sampled_from(["", "[thought] ", "\\1 \\g<0>"]))
def test_strip_thinking_removes_what_a_lazy_regex_finds(text: str, placeholder: str) -> None:
    assert strip_thinking(text, placeholder) == _reference_strip(text, placeholder)


def test_strip_thinking_is_linear_on_unclosed_blocks() -> None:
    text = "<think>" * 100_000 + "x</think"  # 700 kB, no block ever closes
    started = time.perf_counter()
    assert strip_thinking(text) == text
    assert strip_thinking("<think>a</think> " * 100_000 + "<think>" * 100_000) == "<think>" * 100_000
    # linear: milliseconds; the lazy regex took minutes (quadratic)
    assert time.perf_counter() - started < 5.0


def _tool_calls(text: str) -> list[dict]:
    return [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": {"x": [text]}}}]


def _played(ctx, first: str, events: list[tuple[str, str]]):
    ctx.on_env_reset(first, {})
    for kind, text in events:
        if kind == "obs":
            ctx.on_after_step(text, {})
        elif kind == "reply":
            ctx.on_after_act(ChatResponse(text=text))
        elif kind == "call":
            ctx.append_message({"role": "assistant", "content": text, "tool_calls": _tool_calls(text)})
        elif kind == "tool":
            ctx.append_message({"role": "tool", "name": "f", "content": text})
        else:
            ctx.on_after_step(None, {})
    return ctx


def _prompt_keeps_history_intact(ctx) -> list[dict]:
    """The prompt; checks building it and then changing it leaves the history as it was."""
    history = copy.deepcopy(ctx.messages)
    prompt = ctx.on_before_act()
    assert ctx.messages == history
    for messages in (prompt, ctx.messages):
        for message in messages:
            message["content"] += "changed"
            for call in message.get("tool_calls", []):
                call["function"]["arguments"]["x"].append("changed")
            message.get("tool_calls", []).append({"id": "changed"})
    assert ctx.messages == history
    return ctx.on_before_act()


_systems = st.none() | st.text(max_size=5)


@FAST
@given(_systems, _texts, _events)
def test_full_dialog_sends_every_message_once_in_order(system: str | None, first: str, events) -> None:
    ctx = _played(FullDialog(system_prompt=system), first, events)
    prompt = _prompt_keeps_history_intact(ctx)
    expected = [{"role": "system", "content": system}] if system else []
    expected.append({"role": "user", "content": first})
    for kind, text in events:
        if kind == "call":
            expected.append({"role": "assistant", "content": text, "tool_calls": _tool_calls(text)})
        elif kind != "end":
            role = {"obs": "user", "reply": "assistant", "tool": "tool"}[kind]
            expected.append({"role": role, "content": text} | ({"name": "f"} if role == "tool" else {}))
    assert prompt == ctx.messages == expected


@FAST
@given(_systems, _texts, _events, st.integers(1, 10))
def test_recent_messages_sends_the_system_prompt_and_the_last_keep_messages_and_whole_tool_exchanges(
    system: str | None, first: str, events, keep: int
) -> None:
    ctx = _played(RecentMessages(keep=keep, system_prompt=system), first, events)
    prompt = _prompt_keeps_history_intact(ctx)
    history = ctx.messages
    head, body = (history[:1], history[1:]) if system else ([], history)
    sent = min(keep, len(body))
    while sent < len(body) and body[-sent]["role"] == "tool":  # the calls these results answer go too
        sent += 1
    assert prompt == head + body[-sent:]
    assert [m["role"] for m in prompt].count("system") == len(head)
    # the first message after the system prompt is never a tool result (the first observation precedes any)
    assert prompt[len(head)]["role"] != "tool"


@FAST
@given(_systems, _texts, _events, st.sampled_from(["", "[thought] "]))
def test_truncated_thinking_changes_only_assistant_thinking_in_the_prompt(
    system: str | None, first: str, events, placeholder: str
) -> None:
    ctx = _played(TruncatedThinkingContext(system_prompt=system, placeholder=placeholder), first, events)
    prompt = _prompt_keeps_history_intact(ctx)
    history = ctx.messages
    assert len(prompt) == len(history)
    for sent, kept in zip(prompt, history):
        if kept["role"] == "assistant":
            assert sent == {**kept, "content": _reference_strip(kept["content"], placeholder)}
        else:
            assert sent == kept


_tag_cases = st.sampled_from(["think", "Think", "THINK", "tHiNk"])


@FAST
@given(st.text(" \n\t", max_size=2), _tag_cases, _texts, _tag_cases, _texts)
def test_what_think_prefix_parser_reads_as_thinking_is_what_strip_thinking_removes(
    pad: str, opening: str, thought: str, closing: str, answer: str
) -> None:
    from ludic.parsers import think_prefix_parser

    reply = f"{pad}<{opening}>{thought}</{closing}>{answer}"
    action = think_prefix_parser()(reply).action
    if action is not None and not re.search("<think>", action, re.IGNORECASE):  # no block left in the answer
        assert strip_thinking(reply).strip() == action
