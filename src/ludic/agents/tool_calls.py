"""Reading tool calls out of a model reply, in linear time.

Sources, in order of preference:
1. the server's structured ``tool_calls`` (OpenAI shape: ``{"id", "type": "function",
   "function": {"name", "arguments": <JSON string or object>}}``);
2. Hermes/Qwen text blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
3. a plain JSON fallback: the whole reply is one ``{"name": ..., "arguments": {...}}`` object
   (or a list of them) and nothing else.

A call whose JSON is invalid is still returned (with ``error`` set) so the agent can answer it
with a tool message saying what went wrong: invalid JSON (``NaN``/``Infinity``, which JSON does not
have, and integers of more than 4,300 digits included), arguments that are not an object, an entry of
``tool_calls`` that is not an object. Nothing a reply holds makes parsing raise. Parsing never backtracks: an unclosed
``<tool_call>`` stops the scan, so adversarial replies cost O(length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<keyword arguments as JSON>}}</tool_call>'
_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


@dataclass
class ToolCall:
    """One requested call. ``error`` is set when the request itself was malformed."""

    id: str
    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None

    def as_message_entry(self) -> dict[str, Any]:
        """The entry kept in the assistant message's ``tool_calls`` (arguments as an object,
        which is what Hugging Face chat templates render)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments or {}},
        }


def parse_text_tool_calls(text: str, *, first_id: int = 0) -> tuple[str, list[ToolCall]]:
    """(the reply without its well-formed call blocks, the calls in order)."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:  # unclosed: not a call; nothing after it can be one either
            break
        call = _call_from_json_text(text[start + len(OPEN) : end].strip(), f"call_{first_id + len(calls)}")
        calls.append(call)
        kept.append(text[pos:start] if call.error is None else text[pos : end + len(CLOSE)])
        pos = end + len(CLOSE)
    kept.append(text[pos:])
    if calls:
        return "".join(kept).strip(), calls
    return text, _plain_json_calls(text, first_id)


def structured_tool_calls(entries: list[dict[str, Any]], *, first_id: int = 0) -> list[ToolCall]:
    """Calls from a server's ``message.tool_calls`` (arguments as a JSON string or an object)."""
    calls = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            calls.append(ToolCall(f"call_{first_id + i}", None, None, f"a tool call must be a JSON object, got {entry!r:.80}"))  # fmt: skip
            continue
        call_id = str(entry.get("id") or f"call_{first_id + i}")
        fn = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        name, args = fn.get("name"), fn.get("arguments", {})
        if isinstance(args, str):
            calls.append(_call_from_obj_or_error(name, args, call_id))
        else:
            calls.append(_checked(name, args, call_id))
    return calls


def _call_from_obj_or_error(name: Any, args_text: str, call_id: str) -> ToolCall:
    try:
        args = _loads(args_text) if args_text.strip() else {}
    except (ValueError, RecursionError) as exc:
        return ToolCall(call_id, _name(name), None, f"invalid JSON in tool call arguments ({_why(exc)})")
    return _checked(name, args, call_id)


def _call_from_json_text(body: str, call_id: str) -> ToolCall:
    try:
        obj = _loads(body)
    except (ValueError, RecursionError) as exc:
        return ToolCall(call_id, None, None, f"invalid JSON in tool call ({_why(exc)}). Expected {CALL_FORMAT}")
    if not isinstance(obj, dict):
        return ToolCall(call_id, None, None, f"a tool call must be a JSON object. Expected {CALL_FORMAT}")
    return _checked(obj.get("name"), obj.get("arguments", obj.get("parameters", {})), call_id)


def _checked(name: Any, args: Any, call_id: str) -> ToolCall:
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, None, None, f"a tool call needs a \"name\" string. Expected {CALL_FORMAT}")
    if not isinstance(args, dict):
        return ToolCall(
            call_id, name, None, f"'arguments' must be a JSON object, got {args!r:.80}. Expected {CALL_FORMAT}"
        )
    return ToolCall(call_id, name, args)


def _plain_json_calls(text: str, first_id: int) -> list[ToolCall]:
    body = text.strip()
    if not body.startswith(("{", "[")):
        return []
    try:
        obj = _loads(body)
    except (ValueError, RecursionError):
        return []
    objs = obj if isinstance(obj, list) else [obj]
    if not objs or not all(_looks_like_call(o) for o in objs):
        return []
    return [
        _checked(o["name"], o.get("arguments", o.get("parameters", {})), f"call_{first_id + i}")
        for i, o in enumerate(objs)
    ]


def _looks_like_call(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("name"), str)
        and ("arguments" in obj or "parameters" in obj)
        and set(obj) <= _CALL_KEYS
    )


def _name(name: Any) -> str | None:
    return name if isinstance(name, str) and name else None


def _loads(text: str) -> Any:
    """``json.loads`` as JSON means it: ``NaN``, ``Infinity`` and ``-Infinity`` are errors (ValueError)."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _why(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
