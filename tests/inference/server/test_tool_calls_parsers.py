"""Each tool parser on its own format, on malformed input, and the choice of a parser from a chat template."""

from __future__ import annotations

import json

import pytest

from ludic.inference.server._tool_calls import ToolMode, ToolParserError, read_reply, tool_mode
from ludic.inference.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedReply,
    ParsedToolCall,
    ToolParser,
    detect_tool_parser,
    get_tool_parser,
    register_tool_parser,
    resolve_tool_parser,
)
from ludic.inference.tool_parsers.registry import _REGISTRY
from ludic.testing import CHATML_TEMPLATE


def calls(parsed: ParsedReply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]


# ---- Hermes / Qwen ----------------------------------------------------------------------------------


def test_hermes_reads_each_block_and_keeps_the_text_outside_as_content() -> None:
    text = ('Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "neg", "arguments": {"x": "\\u00e9"}}</tool_call>')  # fmt: skip
    parsed = HermesToolParser().parse(text)
    assert parsed.content == "Let me compute."
    assert calls(parsed) == [("add", {"a": 1, "b": 2}), ("neg", {"x": "é"})]
    ids = [c.id for c in parsed.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2


def test_hermes_calls_only_give_null_content_and_missing_arguments_are_an_empty_object() -> None:
    parsed = HermesToolParser().parse(' <tool_call>{"name": "now"}</tool_call> ')
    assert parsed.content is None and calls(parsed) == [("now", {})]
    as_string = HermesToolParser().parse('<tool_call>{"name": "f", "arguments": "{\\"q\\": 1}"}</tool_call>')
    assert calls(as_string) == [("f", {"q": 1})]  # arguments sent as a JSON string are read too


@pytest.mark.parametrize(
    "text",
    [
        "no calls here",
        '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',  # bad JSON
        '<tool_call>{"name": "add", "arguments": {"a": 1}}',  # never closed
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',  # name not a string
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '<tool_call>["f"]</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',  # empty name
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call> <tool_call>{oops}</tool_call>',  # one bad of two
        "<tool_call>" + "[" * 100_000 + "</tool_call>",  # nesting past Python's recursion limit
    ],
)
def test_hermes_leaves_anything_it_cannot_read_whole_as_plain_content(text: str) -> None:
    assert HermesToolParser().parse(text) == ParsedReply(text, [])


# ---- Llama 3 JSON -----------------------------------------------------------------------------------


def test_llama3_reads_parameters_after_the_python_tag_and_several_calls() -> None:
    parsed = Llama3JsonToolParser().parse('<|python_tag|>{"name": "get", "parameters": {"city": "Oslo"}}')
    assert parsed.content is None and calls(parsed) == [("get", {"city": "Oslo"})]
    two = Llama3JsonToolParser().parse('{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"k": 1}}')
    assert calls(two) == [("a", {}), ("b", {"k": 1})]


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",
        'Sure: {"name": "get", "parameters": {}}',  # prose first: an answer that quotes JSON
        '{"name": "get", "parameters": {"city": "Oslo"}',  # unbalanced
        '{"name": "get", "parameters": {}} and then some words',
        '{"city": "Oslo"}',  # an object that is not a call
        '{"name": "a", "parameters": {}}; not json',
        '{"name": "a", "parameters": 5}',
    ],
)
def test_llama3_leaves_non_calls_as_plain_content(text: str) -> None:
    assert Llama3JsonToolParser().parse(text) == ParsedReply(text, [])


# ---- Mistral ----------------------------------------------------------------------------------------


def test_mistral_reads_the_json_array_spelling_with_nine_character_ids() -> None:
    parsed = MistralToolParser().parse('Checking.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]')
    assert parsed.content == "Checking." and calls(parsed) == [("a", {"x": 1}), ("b", {})]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in parsed.tool_calls)  # what Mistral's templates demand


def test_mistral_reads_the_v11_name_args_spelling() -> None:
    parsed = MistralToolParser().parse('[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]now[ARGS]{}')
    assert parsed.content is None and calls(parsed) == [("add", {"a": 1}), ("now", {})]


@pytest.mark.parametrize(
    "text",
    [
        "plain answer",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}',  # unclosed array
        "[TOOL_CALLS][]",
        '[TOOL_CALLS][{"name": "a"}] trailing words',
        '[TOOL_CALLS]add{"a": 1}',  # no [ARGS]
        '[TOOL_CALLS][ARGS]{"a": 1}',  # no name
        '[TOOL_CALLS]add[ARGS]{"a": 1',
    ],
)
def test_mistral_leaves_malformed_calls_as_plain_content(text: str) -> None:
    assert MistralToolParser().parse(text) == ParsedReply(text, [])


# ---- registry and selection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (CHATML_TEMPLATE, "hermes"),  # Ludic's tiny template renders calls as <tool_call> blocks
        ("{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{% endif %}{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{%- if tools %}{{- '<|python_tag|>' }}{% endif %}", "llama3_json"),
        ('Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}',
         "llama3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
        (None, None),
    ],
)
def test_the_parser_is_detected_from_the_chat_templates_marker(template: str | None, expected: str | None) -> None:
    assert detect_tool_parser(template) == expected


def test_resolve_says_which_parser_and_why() -> None:
    parser, why = resolve_tool_parser("auto", CHATML_TEMPLATE)
    assert isinstance(parser, HermesToolParser) and "detected from the chat template" in why
    assert resolve_tool_parser("none", CHATML_TEMPLATE)[0] is None
    parser, why = resolve_tool_parser("auto", "{{ messages }}")
    assert parser is None and "--tool-parser" in why  # no silent "tools never run": the log says what to do
    assert isinstance(resolve_tool_parser("mistral", CHATML_TEMPLATE)[0], MistralToolParser)  # the flag wins


class UpperParser:
    name = "upper"

    def parse(self, text: str) -> ParsedReply:
        return ParsedReply(None, [ParsedToolCall(text.upper(), "{}")])


def test_a_registered_parser_is_found_by_name_and_names_are_guarded() -> None:
    register_tool_parser("upper_test", UpperParser)
    try:
        parser = get_tool_parser("upper_test")
        assert isinstance(parser, ToolParser) and parser.parse("f").tool_calls[0].name == "F"
        with pytest.raises(ValueError, match="already registered"):
            register_tool_parser("upper_test", UpperParser)
        register_tool_parser("upper_test", HermesToolParser, replace=True)
        assert isinstance(get_tool_parser("upper_test"), HermesToolParser)
    finally:
        _REGISTRY.pop("upper_test", None)
    for bad in ("auto", "none", "", "a:b"):
        with pytest.raises(ValueError, match="reserved"):
            register_tool_parser(bad, UpperParser)


def test_get_tool_parser_refuses_unknown_names_and_objects_that_are_not_parsers() -> None:
    with pytest.raises(ValueError, match="unknown tool parser 'qwen9': choose one of auto, none, hermes"):
        get_tool_parser("qwen9")
    with pytest.raises(ValueError, match="cannot be imported"):
        get_tool_parser("no_such_module_xyz:Parser")
    with pytest.raises(ValueError, match="has no name and parse"):
        get_tool_parser("json:JSONDecoder")  # importable, but not a ToolParser
    assert isinstance(get_tool_parser(f"{__name__}:UpperParser"), UpperParser)


# ---- tool_choice and reading a reply ----------------------------------------------------------------


def test_tool_choice_modes() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tool_mode({"tools": tools}, have_parser=True, exclude_when_none=False) == ToolMode(True, True)
    assert tool_mode({"tools": tools, "tool_choice": "none"}, have_parser=True, exclude_when_none=False) == ToolMode(True, False)
    assert tool_mode({"tools": tools, "tool_choice": "none"}, have_parser=True, exclude_when_none=True) == ToolMode(False, False)
    assert tool_mode({"tools": tools}, have_parser=False, exclude_when_none=False) == ToolMode(True, False)
    assert tool_mode({}, have_parser=True, exclude_when_none=False) == ToolMode(False, False)
    assert tool_mode({"tool_choice": "auto"}, have_parser=True, exclude_when_none=False) == ToolMode(False, False)
    both = [*tools, {"type": "function", "function": {"name": "g"}}]
    required = tool_mode({"tools": both, "tool_choice": "required"}, have_parser=True, exclude_when_none=False)
    assert required == ToolMode(True, True, forced="", allowed=frozenset({"f", "g"}))
    named = tool_mode({"tools": both, "tool_choice": {"type": "function", "function": {"name": "g"}}},
                      have_parser=True, exclude_when_none=False)  # fmt: skip
    assert named == ToolMode(True, True, forced="g", allowed=frozenset({"g"}))
    for body, have_parser, words in [
        ({"tools": tools, "tool_choice": {"type": "function"}}, True, "names the function 'None', which is not among"),
        ({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "h"}}}, True, r"'h'.*\(f\)"),
        ({"tool_choice": "required"}, True, "needs tools"),
        ({"tools": tools, "tool_choice": "required"}, False, "needs a tool parser"),
        ({"tools": tools, "tool_choice": 7}, True, "tool_choice must be"),
    ]:
        with pytest.raises(ValueError, match=words):
            tool_mode(body, have_parser=have_parser, exclude_when_none=False)


def test_read_reply_sets_the_finish_reason_and_a_failing_parser_is_the_servers_error() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    on = ToolMode(True, True)
    assert read_reply(text, "stop", HermesToolParser(), on)[1] == "tool_calls"
    assert read_reply(text, "length", HermesToolParser(), on)[1] == "length"  # cut short: said so, calls kept
    assert read_reply(text, "stop", HermesToolParser(), ToolMode(True, False)) == (ParsedReply(text, []), "stop")

    class Broken:
        name = "broken"

        def parse(self, text: str) -> ParsedReply:
            raise ValueError("boom")

    with pytest.raises(ToolParserError, match="tool parser 'broken' raised on a reply: ValueError: boom"):
        read_reply(text, "stop", Broken(), on)  # a RuntimeError: the server answers 500, not a 400 to the client
