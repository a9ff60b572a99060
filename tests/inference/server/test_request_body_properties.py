"""The server's request-body validators (issue 37), property-tested: ``parse_json``, ``parse_sampling``,
``parse_token_ids``, ``parse_chat_request`` (what the chat, completions and generate routes run first).

Invariant: on any input each raises ``BadRequest`` (HTTP 400) naming what is wrong, or returns a value
exactly equal to the one built from the well-formed fields; never another exception, never a hang.
"""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.inference.server._generate import (
    SAMPLING_FIELDS,
    BadRequest,
    parse_chat_request,
    parse_sampling,
    parse_token_ids,
)
from ludic.inference.server._json import MAX_JSON_DEPTH, parse_json

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_sampling_values = {
    "temperature": st.floats() | st.integers(-3, 3) | st.booleans() | st.text(max_size=3) | st.none(),
    "top_p": st.floats() | st.integers(-1, 2) | st.booleans() | st.none(),
    "max_tokens": st.integers(-2, 2**40) | st.floats(0, 10) | st.booleans() | st.text(max_size=2) | st.none(),
    "max_completion_tokens": st.integers(-2, 100) | st.none(),
    "seed": st.integers(-(2**64), 2**64) | st.floats(0, 5) | st.none() | st.booleans(),
    "stop": st.text(max_size=5)
    | st.lists(st.text(max_size=4) | st.integers(), max_size=3)
    | st.none()
    | st.integers(),
    "n": st.integers(0, 3) | st.none(),
}
_sampling_bodies = st.fixed_dictionaries({}, optional=_sampling_values) | _json


def _real(value) -> bool:
    return type(value) in (int, float)


@given(st.binary(max_size=120) | _json.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_are_refused_as_bad_json_or_parse_to_finite_json(raw):
    try:
        value = parse_json(raw)
    except BadRequest as exc:
        assert str(exc).startswith(("request body is not valid JSON", "request body is nested too deeply")) or "JSON" in str(exc)  # fmt: skip
        return
    assert (
        json.loads(json.dumps(value, allow_nan=False)) == value
    )  # finite numbers only: allow_nan=False holds

    def depth(v) -> int:
        return 1 + max(map(depth, v.values() if isinstance(v, dict) else v), default=0) if isinstance(v, (list, dict)) else 0  # fmt: skip

    assert depth(value) <= MAX_JSON_DEPTH


@given(_sampling_bodies)
def test_any_sampling_fields_are_refused_naming_one_or_are_exactly_a_well_formed_config(body):
    try:
        got = parse_sampling(body)
    except BadRequest as exc:
        assert str(exc)
        return
    assert isinstance(body, dict) and body.get("n", 1) == 1
    fields = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    if body.get("max_completion_tokens") is not None:
        fields["max_tokens"] = body["max_completion_tokens"]
    want = SamplingConfig(**fields)
    assert got == want
    assert _real(got.temperature) and math.isfinite(got.temperature) and got.temperature >= 0
    assert _real(got.top_p) and 0 < got.top_p <= 1
    assert type(got.max_tokens) is int and got.max_tokens >= 1
    assert got.seed is None or (type(got.seed) is int and -(2**63) <= got.seed < 2**63)
    assert all(type(s) is str and s for s in got.stop)


@given(_json)
def test_any_token_ids_are_refused_or_are_exactly_a_list_of_non_negative_ints(value):
    try:
        ids = parse_token_ids(value, "prompt")
    except BadRequest as exc:
        assert "prompt" in str(exc)
        return
    assert ids == value and ids and all(type(t) is int and t >= 0 for t in ids)


_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"]) | _json},
        optional={"content": st.text(max_size=10) | _json, "tool_calls": _json},
    )
    | _json,
    max_size=3,
)


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "messages": _messages | _json,
            "model": st.text(max_size=5) | _json,
            "prompt_token_ids": st.lists(st.integers(-2, 300), max_size=3) | _json,
            "tools": st.lists(st.dictionaries(st.text(max_size=3), _json, max_size=2), max_size=2) | _json,
            "temperature": _sampling_values["temperature"],
        },
    )
    | _json
)
def test_any_chat_body_is_refused_naming_a_field_or_is_exactly_the_well_formed_request(body):
    try:
        got = parse_chat_request(body, "served")
    except BadRequest as exc:
        assert str(exc)
        return
    want = ChatCompletionRequest(
        model=str(body.get("model") or "served"), messages=body["messages"], sampling=parse_sampling(body),
        prompt_token_ids=body.get("prompt_token_ids"), tools=body.get("tools"),
    )  # fmt: skip
    assert got == want
    assert all(
        (isinstance(m, dict) and isinstance(m.get("content"), str)) or m.get("tool_calls") for m in got.messages
    )
