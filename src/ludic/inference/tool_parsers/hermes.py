"""Hermes/Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in the reply.

Qwen2.5/Qwen3, Hermes 2/3 and Ludic's tiny ChatML template use it. Text outside the blocks is the
reply's content. One malformed block (bad JSON, no name, no closing tag) makes the whole reply plain
content: a half-read reply would run some calls and silently drop another.
"""

from __future__ import annotations

import json

from ludic.inference.tool_parsers.base import ParsedReply, ParsedToolCall, call_from_object, finish, plain
from ludic.inference.tool_parsers.forcing import marker_start
from ludic.inference.tool_parsers.partial_json import Malformed, skip_ws, strict_loads
from ludic.inference.tool_parsers.streaming import PartialCall, read_call_object

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolParser:
    name = "hermes"

    def parse(self, text: str) -> ParsedReply:
        if OPEN not in text:
            return plain(text)
        calls: list[ParsedToolCall] = []
        outside: list[str] = []
        pos = 0
        while (start := text.find(OPEN, pos)) != -1:  # each find moves forward: linear in the reply
            end = text.find(CLOSE, start + len(OPEN))
            if end == -1:
                return plain(text)
            outside.append(text[pos:start])
            try:
                calls.append(call_from_object(strict_loads(text[start + len(OPEN) : end])))
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; deep nesting
                return plain(text)
            pos = end + len(CLOSE)
        outside.append(text[pos:])
        return finish("".join(outside), calls)

    def call_start(self, text: str) -> int:
        return marker_start(text, OPEN)

    def partial_calls(self, text: str) -> list[PartialCall]:
        """The blocks begun so far, up to the first that cannot be a call (see ``streaming``)."""
        calls: list[PartialCall] = []
        pos = 0
        while (start := text.find(OPEN, pos)) != -1:
            try:
                call, end = read_call_object(text, start + len(OPEN))
            except Malformed:
                break
            calls.append(call)
            if end is None:
                break
            after = skip_ws(text, end)
            if not CLOSE.startswith(text[after : after + len(CLOSE)]):
                break  # text after the object inside the block: the reply will be plain content
            pos = after
        return calls

    def forced_prefix(self, function: str | None, chat_template: str | None) -> str:
        """``<tool_call>`` (+ a newline where the template writes one, as Qwen's do) and, for a named
        function, the call object up to ``"arguments":``, no space after: BPE tokenizers write `` {"`` as one
        token, which a prefill ending in a space would split into two the model never learnt to write."""
        newline = "\n" if chat_template and (OPEN + "\n" in chat_template or OPEN + "\\n" in chat_template) else ""
        if function is None:
            return OPEN + newline
        return OPEN + newline + '{"name": ' + json.dumps(function, ensure_ascii=False) + ', "arguments":'
