"""What a tool parser is: reply text in, (content, tool calls) out, as vLLM's tool parsers do.

A chat template teaches a model one format for calling a tool (Hermes/Qwen ``<tool_call>`` blocks,
Llama-3 bare JSON, Mistral ``[TOOL_CALLS]``). A parser reads that format back out of a finished
reply, so the server can answer with OpenAI ``tool_calls`` instead of text. Parsers never raise on
what a model wrote: a reply they cannot read whole is plain content (``ParsedReply(text, [])``).
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic.inference.tool_parsers.partial_json import strict_loads


@dataclass(frozen=True)
class ParsedToolCall:
    """One call read from a reply: the function's name and its arguments as a JSON object's text."""

    name: str
    arguments: str
    """JSON text of an object (what OpenAI's ``function.arguments`` carries)."""
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool call needs a non-empty function name")
        if not isinstance(json.loads(self.arguments), dict):
            raise ValueError(f"tool call arguments must be a JSON object, got {self.arguments[:80]!r}")

    def as_openai(self) -> dict[str, Any]:
        """The entry of an OpenAI ``message.tool_calls`` list."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into the text outside the calls (``None`` when there is none) and the calls."""

    content: str | None
    tool_calls: list[ParsedToolCall]


@runtime_checkable
class ToolParser(Protocol):
    """The seam: a parser for one tool-call format (see ``inference/tool_parsers/registry.py`` to add one).

    Optional methods: ``call_start``/``forced_prefix`` (``forcing.py``), ``partial_calls`` (``streaming.py``)."""

    name: str

    def parse(self, text: str) -> ParsedReply:
        """Split a finished reply; a reply with no well-formed call comes back as ``ParsedReply(text, [])``."""
        ...


def plain(text: str) -> ParsedReply:
    """The reply as content only (no calls, or calls that could not be read)."""
    return ParsedReply(text, [])


def call_from_object(obj: Any, args_keys: tuple[str, ...] = ("arguments",), *, mistral_id: bool = False) -> ParsedToolCall:
    """A call from a decoded ``{"name": ..., "arguments": {...}}`` object; ValueError when it is not one.

    ``args_keys`` are the names the format uses for the arguments (Llama-3 says ``parameters``);
    arguments may be an object or a string holding one; missing arguments are ``{}``.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError(f"not a tool call object: {str(obj)[:80]!r}")
    args: Any = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):
        args = strict_loads(args)  # some models emit the arguments as a JSON string
    if not isinstance(args, dict):
        raise ValueError(f"tool call arguments must be an object, got {type(args).__name__}")
    text = json.dumps(args, ensure_ascii=False)
    return ParsedToolCall(obj["name"], text, mistral_call_id()) if mistral_id else ParsedToolCall(obj["name"], text)


def mistral_call_id() -> str:
    """Mistral's templates refuse tool-call ids that are not 9 letters/digits."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


def finish(content: str, calls: list[ParsedToolCall]) -> ParsedReply:
    """Content stripped, ``None`` when only whitespace is left."""
    content = content.strip()
    return ParsedReply(content or None, calls)
