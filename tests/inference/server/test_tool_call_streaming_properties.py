"""Streamed tool calls add up to the non-streamed ones: for any call a built-in parser reads, written in any
JSON spelling and cut into pieces anywhere, a call's argument fragments concatenate to exactly its
non-streamed ``arguments``, and its arguments are out once their JSON has closed (before the reply ends)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.inference.tool_parsers import HermesToolParser, Llama3JsonToolParser, MistralToolParser
from ludic.inference.tool_parsers.partial_json import Malformed, canonical_prefix
from ludic.inference.tool_parsers.streaming import CallStream, ToolCallDelta, call_stream

scalars = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10)  # fmt: skip
arguments = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
names = st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="_-."), min_size=1, max_size=10)
spellings = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"ensure_ascii": False},
                             {"separators": (" ,", " : "), "ensure_ascii": False}])  # fmt: skip


def spell(value: Any, how: dict[str, Any]) -> str:
    return json.dumps(value, **how)


def reply(fmt: str, calls: list[tuple[str, dict[str, Any]]], how: dict[str, Any], before: str) -> tuple[str, list[int]]:
    """A reply holding ``calls`` in ``fmt``, and where each call's arguments JSON ends in it."""
    text, ends = "", []
    for i, (name, args) in enumerate(calls):
        head = {"hermes": f"{before if i == 0 else ' '}<tool_call>\n{{\"name\": {json.dumps(name)}, \"arguments\": ",
                "llama3": ("<|python_tag|>" if i == 0 else "; ") + f'{{"name": {json.dumps(name)}, "parameters": ',
                "mistral": (f"{before}[TOOL_CALLS][" if i == 0 else ", ") + f'{{"name": {json.dumps(name)}, "arguments": ',
                "mistral_v11": f"{before if i == 0 else ''}[TOOL_CALLS]{name}[ARGS]"}[fmt]  # fmt: skip
        text += head + spell(args, how)
        ends.append(len(text))
        text += {"hermes": "}\n</tool_call>", "llama3": "}", "mistral": "}", "mistral_v11": ""}[fmt]
    return text + ("]" if fmt == "mistral" else ""), ends


PARSERS = {"hermes": HermesToolParser, "llama3": Llama3JsonToolParser, "mistral": MistralToolParser,
           "mistral_v11": MistralToolParser}  # fmt: skip


def accumulate(deltas: list[ToolCallDelta]) -> dict[int, tuple[str | None, str]]:
    """What the OpenAI SDK's accumulator builds: per index, the name and the arguments' concatenation."""
    out: dict[int, tuple[str | None, str]] = {}
    for d in deltas:
        name, args = out.get(d.index, (None, ""))
        if d.name is not None:
            assert name is None and d.id and d.arguments == "", "a call is named once, by its first delta"
            name = d.name
        out[d.index] = (name, args + d.arguments)
    return out


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(sorted(PARSERS)), calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3),
       how=spellings, before=st.sampled_from(["", "Let me compute. "]), cuts=st.lists(st.integers(0, 10**4), max_size=30))  # fmt: skip
def test_fragments_add_up_to_the_non_streamed_arguments_wherever_the_reply_is_cut(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], how: dict[str, Any], before: str, cuts: list[int]
) -> None:
    if fmt == "llama3":
        before = ""  # a Llama-3 reply is all calls or none
    text, ends = reply(fmt, calls, how, before)
    parser = PARSERS[fmt]()
    parsed = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(n, a) for n, a in calls]
    stream = call_stream(parser)
    assert stream is not None
    deltas: list[ToolCallDelta] = []
    for cut in sorted({c % (len(text) + 1) for c in cuts} | set(ends)):  # the text as decoding steps see it
        deltas += stream.update(text[:cut])
        for i, end in enumerate(ends):
            if end <= cut:  # a call whose arguments' JSON has closed has them all out, before the reply ends
                assert accumulate(deltas)[i] == (calls[i][0], parsed.tool_calls[i].arguments)
    deltas += stream.finish(parsed.tool_calls)
    assert accumulate(deltas) == {i: (c.name, c.arguments) for i, c in enumerate(parsed.tool_calls)}


@settings(max_examples=100, deadline=None)
@given(value=json_values, how=spellings, cut=st.integers(0, 10**4))
def test_the_sure_prefix_of_any_cut_is_a_prefix_of_the_whole_spelling(value: Any, how: dict[str, Any], cut: int) -> None:
    text = spell(value, how)
    whole = json.dumps(json.loads(text), ensure_ascii=False)
    part, complete = canonical_prefix(text[: cut % (len(text) + 1)])
    assert whole.startswith(part) and (part == whole or not complete)
    assert canonical_prefix(text) == (whole, True) or not isinstance(value, (dict, list, str))


def test_a_surrogate_pair_waits_for_its_second_half() -> None:
    text = json.dumps({"s": "a\U0001f600"})  # ensure_ascii: "a\ud83d\ude00"
    cut = text.index("\\ude00")
    assert canonical_prefix(text[:cut]) == ('{"s": "a', False)
    assert canonical_prefix(text) == ('{"s": "a\U0001f600"}', True)


def test_numbers_and_literals_wait_for_what_follows_them() -> None:
    assert canonical_prefix('{"n": 12') == ('{"n": ', False)  # 12 may become 123
    assert canonical_prefix('{"n": 1.50,') == ('{"n": 1.5, ', False)
    assert canonical_prefix('{"b": tru') == ('{"b": ', False)
    assert canonical_prefix('{"b": true}') == ('{"b": true}', True)


@pytest.mark.parametrize("bad", ['{"a": 1 "b"', '{"a": nope}', '{"a": 01}', '{"a": 1, "a": 2}', '{1: 2}'])
def test_text_that_cannot_become_json_is_malformed(bad: str) -> None:
    with pytest.raises(Malformed):
        canonical_prefix(bad)


def test_a_key_written_twice_makes_the_reply_plain_content_as_streaming_could_not_take_it_back() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1, "b": 2, "a": 3}}</tool_call>'
    assert HermesToolParser().parse(text).tool_calls == []  # json.loads would have kept a=3 at a's place
    stream = call_stream(HermesToolParser())
    assert stream is not None
    deltas = [d for n in range(len(text) + 1) for d in stream.update(text[:n])]
    assert accumulate(deltas) == {0: ("f", '{"a": 1, "b": 2, "a')}  # nothing past the point it went wrong


def test_a_call_that_proves_malformed_mid_value_keeps_what_went_out_and_finishes_nothing() -> None:
    text = 'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
    parser = HermesToolParser()
    assert parser.parse(text).tool_calls == []  # the whole reply is plain content
    stream = call_stream(parser)
    assert stream is not None
    deltas = [d for n in range(len(text) + 1) for d in stream.update(text[:n])]
    # sure until '<', which cannot begin a value
    assert accumulate(deltas) == {0: ("calculator", '{"expression": ')}
    assert stream.finish(parser.parse(text).tool_calls) == []
    # the same reply read in two decode steps: what the second step made sure never went out
    coalesced = call_stream(parser)
    assert coalesced is not None
    first = coalesced.update(text[: text.index('"expression"') + 5])
    assert accumulate(first + coalesced.update(text)) == {0: ("calculator", '{"expr')}


def test_arguments_given_as_a_json_string_are_sent_whole_at_the_end() -> None:
    text = '{"name": "f", "parameters": "{\\"x\\": 1}"}'
    parser = Llama3JsonToolParser()
    stream = call_stream(parser)
    assert stream is not None
    deltas = [d for n in range(len(text) + 1) for d in stream.update(text[:n])]
    assert accumulate(deltas) == {0: ("f", "")}
    deltas += stream.finish(parser.parse(text).tool_calls)
    assert accumulate(deltas) == {0: ("f", '{"x": 1}')}


def test_a_parser_without_partial_calls_falls_back_to_whole_calls() -> None:
    class Mine:
        name = "mine"

        def parse(self, text: str) -> Any:
            return HermesToolParser().parse(text)

    assert call_stream(Mine()) is None
    broken = CallStream(lambda text: 1 / 0)  # type: ignore[arg-type,return-value]  # a parser's bug mid-stream
    assert broken.update("anything") == []


def test_mistral_ids_keep_the_nine_character_form() -> None:
    stream = call_stream(MistralToolParser())
    assert stream is not None
    [named, *_] = stream.update('[TOOL_CALLS][{"name": "f", "arguments": {"x"')
    assert named.id is not None and len(named.id) == 9 and named.id.isalnum()
