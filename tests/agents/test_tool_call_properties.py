"""Tool-call arguments as agents read them (issue 37): nothing in a reply makes parsing raise.

Invariant (``parse_text_tool_calls``, ``structured_tool_calls``): each call is refused (``error`` set,
``arguments`` None: the agent answers it with a tool message) or accepted with a non-empty ``name`` and
``arguments`` exactly the JSON object the reply held; a well-formed call is always accepted as itself.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ludic.agents.tool_calls import CLOSE, OPEN, parse_text_tool_calls, structured_tool_calls

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_arguments = st.dictionaries(st.text(max_size=6), _json, max_size=4)
_names = st.text(min_size=1, max_size=10)
_junk_bodies = (
    _json.map(json.dumps)
    | st.text(max_size=30)
    | st.sampled_from(["{", '{"name": "f", "arguments": NaN}', '{"name": "f", "arguments": {"x": Infinity}}'])
    | st.builds(lambda n: '{"name": "f", "arguments": {"x": ' + "9" * n + "}}", st.integers(4000, 6000))
)


def _accepted_or_refused(call) -> None:
    if call.error is not None:
        assert call.arguments is None and isinstance(call.error, str) and call.error
    else:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)


@given(st.lists(st.one_of(st.tuples(st.just("call"), _names, _arguments), st.tuples(st.just("junk"), _junk_bodies), st.tuples(st.just("text"), st.text(max_size=20))), max_size=5))  # fmt: skip
def test_any_reply_parses_into_accepted_or_refused_calls_and_well_formed_ones_are_themselves(parts):
    text, wanted = "", []
    for kind, *rest in parts:
        if kind == "call":
            text += OPEN + json.dumps({"name": rest[0], "arguments": rest[1]}) + CLOSE
            wanted.append((rest[0], rest[1]))
        elif kind == "junk":
            text += OPEN + rest[0] + CLOSE
            wanted.append(None)
        else:
            text += rest[0]
    _, calls = parse_text_tool_calls(text)
    for call in calls:
        _accepted_or_refused(call)
    if OPEN not in "".join(p[1] for p in parts if p[0] == "text") and CLOSE not in "".join(
        str(p[1]) for p in parts if p[0] != "call"
    ):  # the blocks are exactly those written
        assert len(calls) == len(wanted)
        for call, want in zip(calls, wanted, strict=True):
            if want is not None:
                assert (call.name, call.arguments, call.error) == (want[0], want[1], None)


@given(st.lists(st.one_of(_json, st.fixed_dictionaries({"id": st.text(max_size=4), "function": st.fixed_dictionaries({"name": _json | _names, "arguments": _arguments.map(json.dumps) | _arguments | _junk_bodies | _json})})), max_size=4))  # fmt: skip
def test_any_structured_tool_calls_are_accepted_or_refused(entries):
    calls = structured_tool_calls(entries)
    assert len(calls) == len(entries)
    for entry, call in zip(entries, calls, strict=True):
        _accepted_or_refused(call)
        fn = entry.get("function") if isinstance(entry, dict) else None
        if (
            isinstance(fn, dict)
            and isinstance(fn["name"], str)
            and fn["name"]
            and isinstance(fn["arguments"], dict)
        ):
            assert (call.name, call.arguments) == (fn["name"], fn["arguments"])


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}", "Exceeds the limit (4300 digits)"),
        ('{"name": "f", "arguments": {"x": NaN}}', "NaN is not JSON"),
        ('{"name": "f", "arguments": {"x": -Infinity}}', "-Infinity is not JSON"),
    ],
)
def test_huge_integers_and_non_finite_numbers_are_refused_not_raised(body, why):
    (call,) = parse_text_tool_calls(OPEN + body + CLOSE)[1]
    assert call.arguments is None and why in call.error
    (call,) = structured_tool_calls([{"function": {"name": "f", "arguments": body[27:-1]}}])
    assert call.arguments is None and why in call.error
    assert parse_text_tool_calls(body) == (body, [])  # the plain-JSON fallback: not a call, no exception


def test_a_structured_entry_that_is_not_an_object_is_refused():
    calls = structured_tool_calls([1, "x", None, {"function": {"name": "f", "arguments": "{}"}}])
    assert [c.error is not None for c in calls] == [True, True, True, False]
    assert calls[0].error == "a tool call must be a JSON object, got 1" and calls[3].arguments == {}
