import json
import time
from typing import Literal

import pytest

from ludic.agents.tool_calls import parse_text_tool_calls, structured_tool_calls
from ludic.agents.tools import Tool, as_tools


def search(query: str, k: int = 3, mode: Literal["web", "news"] = "web", tags: list[str] | None = None) -> str:
    """Search the index.

    Args:
        query: what to look for.
        k (int): how many results.
    """
    return query


def test_tool_schema_is_built_from_type_hints_defaults_and_docstring():
    assert Tool.from_callable(search).schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for."},
                    "k": {"type": "integer", "description": "how many results."},
                    "mode": {"enum": ["web", "news"]},
                    "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
                },
                "required": ["query"],
            },
        },
    }


def test_tool_schema_rejects_types_it_cannot_describe_and_duplicate_names():
    def bad(x: object) -> str:
        return ""

    with pytest.raises(TypeError, match="tool 'bad' parameter 'x': cannot describe type"):
        Tool.from_callable(bad)
    with pytest.raises(ValueError, match="two tools are named 'search'"):
        as_tools([search, search])
    assert list(as_tools({"find": search})) == ["find"]


def test_hermes_blocks_are_read_in_order_and_removed_from_the_content():
    text = (
        'Let me check. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>\n{"name": "mul", "parameters": {"b": 2}}\n</tool_call>'
    )
    content, calls = parse_text_tool_calls(text, first_id=4)
    assert content == "Let me check."
    assert [(c.id, c.name, c.arguments, c.error) for c in calls] == [
        ("call_4", "add", {"a": 1}, None),
        ("call_5", "mul", {"b": 2}, None),
    ]


def test_invalid_call_json_is_reported_and_left_in_the_content():
    content, calls = parse_text_tool_calls("<tool_call>{nope}</tool_call>")
    assert content == "<tool_call>{nope}</tool_call>"
    assert calls[0].name is None and calls[0].error.startswith("invalid JSON in tool call (Expecting")


def test_plain_json_fallback_only_for_a_reply_that_is_exactly_calls():
    _, calls = parse_text_tool_calls(' {"name": "add", "arguments": {"a": 2}} ')
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 2})]
    _, calls = parse_text_tool_calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]')
    assert [c.name for c in calls] == ["a", "b"]
    assert parse_text_tool_calls('{"name": "x", "arguments": {}, "answer": 3}')[1] == []
    assert parse_text_tool_calls('The call is {"name": "add", "arguments": {}}')[1] == []


def test_structured_calls_accept_json_string_or_object_arguments():
    calls = structured_tool_calls(
        [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1})}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}},
            {"id": "c3", "type": "function", "function": {"name": "add", "arguments": "{bad"}},
        ]
    )
    assert [(c.id, c.arguments) for c in calls[:2]] == [("c1", {"a": 1}), ("c2", {"a": 2})]
    assert calls[2].name == "add" and calls[2].error.startswith("invalid JSON in tool call arguments")


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 100_000,  # 1.1 MB of unclosed openings: a lazy regex rescans each one
        "<tool_call>{" + "[" * 1_000_000 + "</tool_call>",  # deep nesting inside a closed block
        "[" * 1_000_000,  # deep nesting as a plain-JSON candidate
    ],
)
def test_tool_call_parsing_is_linear_on_adversarial_replies(text):
    started = time.perf_counter()
    parse_text_tool_calls(text)
    assert time.perf_counter() - started < 10.0  # linear: ~0.1 s at 1 MB; quadratic would take minutes
