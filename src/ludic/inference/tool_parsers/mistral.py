"""Mistral format: content, then ``[TOOL_CALLS]`` and the calls.

Two spellings exist: older templates put a JSON array after the marker
(``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``), tokenizer v11+ writes each call as
``[TOOL_CALLS]name[ARGS]{...}``. Both are read; ids are 9 letters/digits, which Mistral's templates
require when the calls are sent back. Anything malformed leaves the reply plain content.
"""

from __future__ import annotations

import json

from ludic.inference.tool_parsers.base import ParsedReply, ParsedToolCall, call_from_object, finish, plain
from ludic.inference.tool_parsers.forcing import marker_start

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

    def forced_prefix(self, function: str | None, chat_template: str | None) -> str:
        """``[TOOL_CALLS]`` (the model picks the call and its spelling); a named function in the array form,
        up to ``"arguments":`` (no space after: see ``HermesToolParser.forced_prefix``)."""
        if function is None:
            return MARKER
        return MARKER + '[{"name": ' + json.dumps(function, ensure_ascii=False) + ', "arguments":'


def _array_calls(tail: str) -> list[ParsedToolCall]:
    decoder = json.JSONDecoder()
    body = tail.strip()
    items, end = decoder.raw_decode(body)
    if body[end:].strip() or not isinstance(items, list) or not items:
        raise ValueError("[TOOL_CALLS] must be followed by one non-empty JSON array")
    return [call_from_object(item, mistral_id=True) for item in items]


def _args_calls(tail: str) -> list[ParsedToolCall]:
    decoder = json.JSONDecoder()
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
