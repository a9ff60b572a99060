"""Llama-3.x JSON format: the reply is ``{"name": ..., "parameters": {...}}`` (optionally after
``<|python_tag|>``), several calls separated by ``;``.

Llama 3.1/3.2/3.3's JSON tool template asks for exactly that. The reply counts as calls only when
all of it (past the tag) is call objects; anything else, malformed JSON included, is plain content.
"""

from __future__ import annotations

import json

from ludic.inference.tool_parsers.base import ParsedReply, ParsedToolCall, call_from_object, plain
from ludic.inference.tool_parsers.partial_json import STRICT_DECODER, Malformed, skip_ws
from ludic.inference.tool_parsers.streaming import PartialCall, read_call_object

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser:
    name = "llama3_json"

    def parse(self, text: str) -> ParsedReply:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        if not body.startswith("{"):
            return plain(text)
        decoder = STRICT_DECODER
        calls: list[ParsedToolCall] = []
        pos = 0
        try:
            while True:
                obj, pos = decoder.raw_decode(body, pos)
                calls.append(call_from_object(obj, ("parameters", "arguments")))
                rest = body[pos:].lstrip()
                if not rest:
                    break
                if not rest.startswith(";"):
                    return plain(text)
                pos = len(body) - len(rest) + 1
                while pos < len(body) and body[pos].isspace():
                    pos += 1
        except (ValueError, RecursionError):
            return plain(text)
        return ParsedReply(None, calls)

    def call_start(self, text: str) -> int:
        """The whole reply is calls or none: held from its start while it may still become one."""
        body = text.lstrip()
        if not body or body.startswith("{") or body.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(body):
            return 0
        return len(text)

    def partial_calls(self, text: str) -> list[PartialCall]:
        """The call objects begun so far, while the reply can still be all calls (see ``streaming``)."""
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :]
        calls: list[PartialCall] = []
        pos = skip_ws(body, 0)
        while pos < len(body):
            try:
                call, end = read_call_object(body, pos, ("parameters", "arguments"))
            except Malformed:
                break
            calls.append(call)
            if end is None:
                break
            pos = skip_ws(body, end)
            if pos < len(body) and body[pos] != ";":
                break
            pos = skip_ws(body, pos + 1)
        return calls

    def forced_prefix(self, function: str | None, chat_template: str | None) -> str:
        if function is None:
            return '{"name": "'
        return '{"name": ' + json.dumps(function, ensure_ascii=False) + ', "parameters":'
