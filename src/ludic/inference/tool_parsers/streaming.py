"""Tool calls streamed as they are decoded, the OpenAI way (as vLLM's tool parsers stream them).

A parser that can read a reply still being written has ``partial_calls(text) -> list[PartialCall]``:
the calls begun so far, each with its name once the name is whole and the sure part of its arguments
(``partial_json.canonical_prefix``). ``CallStream`` turns the growing list into deltas: a call's first
delta carries its ``id`` and ``name`` (arguments ``""``), later ones the next fragment of its
``arguments``. Once the reply is whole and parsed, ``CallStream.finish`` sends what is left of each
parsed call, so the fragments of a call add up to exactly its non-streamed ``arguments``. A parser
without ``partial_calls`` (a user's own) falls back to each call sent whole at the end.

Streamed text cannot be taken back: a call whose text proves malformed only later (never closed, cut
at ``max_tokens``, broken JSON further on) has had its name and first fragments sent; the last chunk's
``finish_reason`` (not ``"tool_calls"``) and ``token_ids`` say what the reply was. vLLM does the same.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ludic.inference.tool_parsers.base import ParsedToolCall
from ludic.inference.tool_parsers.partial_json import (
    Incomplete,
    Malformed,
    canonical_prefix,
    key_and_colon,
    skip_ws,
    string,
    value,
)


@dataclass(frozen=True)
class PartialCall:
    """A call begun in a reply being written: its name once whole, the sure part of its arguments' JSON."""

    name: str | None
    arguments: str = ""


@dataclass(frozen=True)
class ToolCallDelta:
    """One ``delta.tool_calls`` entry: the first of a call names it (``id``, ``name``), the rest carry ``arguments``."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict[str, Any]:
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip


def read_call_object(text: str, i: int, args_keys: tuple[str, ...] = ("arguments",)) -> tuple[PartialCall, int | None]:
    """The ``{"name": ..., "arguments": {...}}`` object at ``text[i]``, as far as written, and the index after it
    (``None`` while it is open). Only ``args_keys[0]`` streams (another key, or arguments given as a JSON
    string, waits for the end). Raises ``Malformed`` when the text cannot become such an object."""
    name: str | None = None
    arguments = ""
    i = skip_ws(text, i)
    if i < len(text) and text[i] != "{":
        raise Malformed("a call is a JSON object")
    scratch: list[str] = []
    try:
        if i >= len(text):
            raise Incomplete
        keys: set[str] = set()
        i = skip_ws(text, i + 1)
        if i < len(text) and text[i] == "}":
            return PartialCall(None), i + 1
        while True:
            i = skip_ws(text, i)
            if i >= len(text):
                raise Incomplete
            i, key = key_and_colon(text, i, keys, scratch)
            start = skip_ws(text, i)
            if key == args_keys[0] and text[start : start + 1] == "{":
                arguments, _ = canonical_prefix(text[start:])
            i = skip_ws(text, value(text, start, scratch))
            if key == "name" and text[start : start + 1] == '"':
                name = string(text, start, [])[1]
            if i >= len(text):
                raise Incomplete
            if text[i] == "}":
                return PartialCall(name, arguments), i + 1
            if text[i] != ",":
                raise Malformed("expected ',' or '}'")
            i += 1
    except Incomplete:
        return PartialCall(name, arguments), None


@dataclass
class CallStream:
    """What of each call has been sent, and the deltas a longer reply adds."""

    partial_calls: Callable[[str], list[PartialCall]]
    new_id: Callable[[], str] = field(default=lambda: "call_" + secrets.token_hex(12))
    names: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)  # arguments sent, per call announced

    def update(self, text: str) -> list[ToolCallDelta]:
        """The deltas the reply so far (``text``) adds; a parser's error stops the stream until the end."""
        try:
            calls = self.partial_calls(text)
        except Exception:  # a parser's bug must not break the reply: the end reconciles what it can
            return []
        out = []
        for index, call in enumerate(calls):
            if index > len(self.names) or (index == len(self.names) and call.name is None):
                break
            if index == len(self.names):
                self.names.append(call.name)  # type: ignore[arg-type]
                self.ids.append(self.new_id())
                self.sent.append("")
                out.append(ToolCallDelta(index, "", self.ids[index], call.name))
            if call.name != self.names[index]:
                break
            sent = self.sent[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                out.append(ToolCallDelta(index, call.arguments[len(sent) :]))
                self.sent[index] = call.arguments
        return out

    def finish(self, calls: list[ParsedToolCall]) -> list[ToolCallDelta]:
        """The deltas that complete the parsed reply's ``calls``: the rest of each begun call, the others whole."""
        out = []
        for index, call in enumerate(calls):
            if index < len(self.names):
                sent = self.sent[index]
                left = call.arguments[len(sent) :]
                if call.name == self.names[index] and call.arguments.startswith(sent) and left:
                    out.append(ToolCallDelta(index, left))
                continue  # a call that diverged from what was streamed cannot be taken back
            out.append(ToolCallDelta(index, "", self.new_id(), call.name))
            out.append(ToolCallDelta(index, call.arguments))
        return out


def call_stream(parser: Any) -> CallStream | None:
    """A ``CallStream`` over ``parser.partial_calls``, or ``None`` for a parser without it (calls sent whole)."""
    method = getattr(parser, "partial_calls", None)
    if method is None:
        return None
    new_id = getattr(parser, "new_call_id", None)
    return CallStream(method, new_id) if callable(new_id) else CallStream(method)
