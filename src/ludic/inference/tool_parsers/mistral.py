"""Mistral format: content, then ``[TOOL_CALLS]`` and the calls.

Two spellings exist: older templates put a JSON array after the marker
(``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``), tokenizer v11+ writes each call as
``[TOOL_CALLS]name[ARGS]{...}``. Both are read; ids are 9 letters/digits, which Mistral's templates
require when the calls are sent back. Anything malformed leaves the reply plain content.
"""

from __future__ import annotations

import json

from ludic.inference.tool_parsers.base import (
    ParsedReply,
    ParsedToolCall,
    call_from_object,
    finish,
    mistral_call_id,
    plain,
)
from ludic.inference.tool_parsers.forcing import marker_start
from ludic.inference.tool_parsers.partial_json import STRICT_DECODER, Malformed, canonical_prefix, skip_ws
from ludic.inference.tool_parsers.streaming import PartialCall, read_call_object

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralToolParser:
    name = "mistral"

    def parse(self, text: str) -> ParsedReply:
        head, marker, tail = text.partition(MARKER)
        if not marker:
            return plain(text)
        try:
            calls = _array_calls(tail) if tail.lstrip().startswith("[") else _args_calls(tail)
        except (ValueError, RecursionError):
            return plain(text)
        return finish(head, calls)

    def call_start(self, text: str) -> int:
        return marker_start(text, MARKER)

    new_call_id = staticmethod(mistral_call_id)

    def partial_calls(self, text: str) -> list[PartialCall]:
        """The calls begun after ``[TOOL_CALLS]`` so far, in either spelling (see ``streaming``)."""
        _, marker, tail = text.partition(MARKER)
        start = skip_ws(tail, 0)
        if not marker or start == len(tail):
            return []
        try:
            return _partial_array(tail, start + 1) if tail[start] == "[" else _partial_args(tail)
        except Malformed:
            return []

    def forced_prefix(self, function: str | None, chat_template: str | None) -> str:
        """``[TOOL_CALLS]`` (the model picks the call and its spelling); a named function in the array form,
        up to ``"arguments":`` (no space after: see ``HermesToolParser.forced_prefix``)."""
        if function is None:
            return MARKER
        return MARKER + '[{"name": ' + json.dumps(function, ensure_ascii=False) + ', "arguments":'


def _array_calls(tail: str) -> list[ParsedToolCall]:
    decoder = STRICT_DECODER
    body = tail.strip()
    items, end = decoder.raw_decode(body)
    if body[end:].strip() or not isinstance(items, list) or not items:
        raise ValueError("[TOOL_CALLS] must be followed by one non-empty JSON array")
    return [call_from_object(item, mistral_id=True) for item in items]


def _args_calls(tail: str) -> list[ParsedToolCall]:
    decoder = STRICT_DECODER
    calls = []
    for part in tail.split(MARKER):
        name, args, raw = part.partition(ARGS)
        raw = raw.strip()
        if not args or not name.strip():
            raise ValueError("expected name[ARGS]{...} after [TOOL_CALLS]")
        obj, end = decoder.raw_decode(raw)
        if raw[end:].strip():
            raise ValueError("text after a call's arguments")
        calls.append(call_from_object({"name": name.strip(), "arguments": obj}, mistral_id=True))
    return calls


def _partial_array(tail: str, pos: int) -> list[PartialCall]:
    calls: list[PartialCall] = []
    while True:
        try:
            call, end = read_call_object(tail, pos)
        except Malformed:
            return calls
        calls.append(call)
        pos = skip_ws(tail, end) if end is not None else len(tail)
        if pos >= len(tail) or tail[pos] != ",":
            return calls
        pos += 1


def _partial_args(tail: str) -> list[PartialCall]:
    calls: list[PartialCall] = []
    for part in tail.split(MARKER):
        name, args, raw = part.partition(ARGS)
        if not args or not name.strip():
            break
        raw = raw.lstrip()
        arguments, _ = canonical_prefix(raw) if raw.startswith("{") else ("", False)
        calls.append(PartialCall(name.strip(), arguments))
    return calls
