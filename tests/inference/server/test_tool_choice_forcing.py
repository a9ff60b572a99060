"""The parts of ``tool_choice`` forcing and of streamed content that need no server: each built-in parser's
forced opening reads back as the call once a model completes it, and ``ContentStream`` sends only text that
is surely content (not a stop string's start, not a call's)."""

from __future__ import annotations

import json

import pytest

from ludic.inference.server._chat_stream import ContentStream
from ludic.inference.server._tool_calls import ToolMode, prefill_text, read_reply, unmet
from ludic.inference.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    ParsedReply,
)
from ludic.inference.tool_parsers.forcing import call_start, marker_start
from ludic.testing import CHATML_TEMPLATE

QWEN_LIKE = "... {{- '<tool_call>\\n{\"name\": \"' }} ..."  # how Qwen2.5's template writes its calls


@pytest.mark.parametrize(
    ("parser", "template", "rest"),
    [
        (HermesToolParser(), CHATML_TEMPLATE, '{"x": 1}}</tool_call>'),
        (HermesToolParser(), QWEN_LIKE, '{"x": 1}}\n</tool_call>'),
        (Llama3JsonToolParser(), None, '{"x": 1}}'),
        (MistralToolParser(), None, '{"x": 1}}]'),
    ],
)
def test_a_named_functions_forced_opening_reads_back_as_that_call(parser, template, rest) -> None:
    mode = ToolMode(True, True, forced="calc", allowed=frozenset({"calc"}))
    prefix = prefill_text(parser, mode, template)
    parsed, finish = read_reply(prefix + rest, "stop", parser, mode)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("calc", {"x": 1})]
    assert finish == "tool_calls" and unmet(parsed, mode) is None
    assert ("\n" in prefix) == (template is QWEN_LIKE)  # Hermes follows the template's newline after <tool_call>


@pytest.mark.parametrize(
    ("parser", "call"),
    [
        (HermesToolParser(), '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'),
        (Llama3JsonToolParser(), '{"name": "calc", "parameters": {"x": 1}}'),
        (MistralToolParser(), '[TOOL_CALLS][{"name": "calc", "arguments": {"x": 1}}]'),
    ],
)
def test_a_named_functions_forced_opening_ends_where_a_bpe_tokenizer_splits_the_call(parser, call) -> None:
    """A byte-level BPE (GPT-2 / Qwen / SmolLM / Llama-3 style) never merges across pre-tokens, and writes
    ``' {"'`` as one. An opening ending in that space made the model continue from a lone space token it never
    learnt to follow (SmolLM2-135M then wrote ``1, "type": ...``, not the arguments object)."""
    from tokenizers.pre_tokenizers import ByteLevel

    prefix = prefill_text(parser, ToolMode(True, True, forced="calc", allowed=frozenset({"calc"})), CHATML_TEMPLATE)
    assert call.startswith(prefix)
    boundaries = {end for _, (_, end) in ByteLevel(add_prefix_space=False).pre_tokenize_str(call)}
    assert len(prefix) in boundaries, f"{prefix!r} ends inside a pre-token of {call!r}"


def test_required_lets_the_model_name_the_function_and_an_unmet_forcing_is_plain_content() -> None:
    parser, mode = HermesToolParser(), ToolMode(True, True, forced="", allowed=frozenset({"calc", "clock"}))
    prefix = prefill_text(parser, mode, CHATML_TEMPLATE)
    assert prefix == "<tool_call>"
    parsed, _ = read_reply(prefix + '{"name": "clock", "arguments": {}}</tool_call>', "stop", parser, mode)
    assert [c.name for c in parsed.tool_calls] == ["clock"]
    text = prefix + "I would rather not"
    assert read_reply(text, "stop", parser, mode) == (ParsedReply(text, []), "stop")
    assert "does not read as a tool call" in unmet(parser.parse(text), mode)
    stray = prefix + '{"name": "shell", "arguments": {}}</tool_call>'
    assert read_reply(stray, "stop", parser, mode)[0].tool_calls == []  # a function tool_choice does not allow
    assert "shell, not among the functions" in unmet(parser.parse(stray), mode)


def test_a_parser_without_forced_prefix_is_refused_naming_it() -> None:
    class Plain:
        name = "plain"

        def parse(self, text: str) -> ParsedReply:
            return ParsedReply(text, [])

    with pytest.raises(ValueError, match="'plain' has no forced_prefix"):
        prefill_text(Plain(), ToolMode(True, True, forced="", allowed=frozenset({"f"})), None)
    assert call_start(Plain(), "anything") == 0  # it streams no content early: all of it is read at the end
    assert prefill_text(Plain(), ToolMode(True, True), None) == ""  # auto forces nothing


def test_call_start_holds_a_marker_and_what_may_become_one() -> None:
    assert marker_start("Let me see <tool", "<tool_call>") == len("Let me see ")
    assert marker_start("a < b", "<tool_call>") == len("a < b")
    assert HermesToolParser().call_start('ok <tool_call>{"na') == 3
    assert MistralToolParser().call_start("sure [TOOL") == 5
    llama = Llama3JsonToolParser()
    assert [llama.call_start(t) for t in ("  ", ' {"na', "<|pyth", "The answer")] == [0, 0, 0, 10]


def stream(text_pieces: list[str], **kwargs) -> list[str]:
    """The content deltas ``ContentStream`` lets out as a byte-per-token reply arrives piece by piece."""
    content = ContentStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"), **kwargs)
    deltas = []
    for piece in text_pieces:
        for byte in piece.encode():
            content.push(len(content.ids), byte)
        deltas.append(content.delta())
    return deltas


def test_content_stream_holds_stop_strings_calls_and_split_characters() -> None:
    assert stream(["Hello", " wor", "ld"]) == ["Hello", " wor", "ld"]
    # a stop string's first characters wait; once it is whole, nothing from it on goes out
    assert stream(["abc", "ST", "OPxyz"], stops=("STOP",)) == ["", "ab", "c"]
    # Hermes: text before the call streams (its trailing space held: a reply with calls is stripped)
    assert stream(["Sure. ", "<tool", '_call>{"name"'], parser=HermesToolParser()) == ["Sure.", "", ""]
    # a forced opening: the reply is a call from its first character, nothing is content
    assert stream(['{"x": 1}}'], prefix='<tool_call>{"name": "f", "arguments": ', parser=HermesToolParser()) == [""]
    # "é" is two bytes: the first alone is not sent as a replacement character
    content = ContentStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    content.push(0, "é".encode()[0])
    assert content.delta() == ""
    content.push(1, "é".encode()[1])
    assert content.delta() == "é"


def test_content_stream_sends_the_rest_of_the_read_reply_at_the_end() -> None:
    content = ContentStream(lambda ids: bytes(ids).decode(), parser=HermesToolParser())
    for byte in b'  Sure. <tool_call>{"name": "f"}</tool_call> done':
        content.push(len(content.ids), byte)
    assert content.delta() == "  Sure."
    parsed = HermesToolParser().parse(content.decode(content.ids))
    assert content.sent + content.rest(parsed.content) == "  " + parsed.content  # only the leading space differs
    content.push(3, ord("x"))  # the row decoded again from position 3: its ids are cut there
    assert content.ids == list(b"  Sx")
