"""Tool calls on the chat route: ``tool_choice`` checked, and the reply read by the server's tool parser.

The parser (``--tool-parser``, ``auto`` by default: detected from the chat template) turns a reply
that holds calls in the template's format into OpenAI ``tool_calls``: ``content`` is the text
outside the calls (``null`` when there is none) and ``finish_reason`` is ``"tool_calls"`` (a reply
cut at ``max_tokens`` keeps ``"length"``). Only the message changes: ``token_ids`` and log-probs stay
those of the whole reply, which is what is recorded and trained. A reply the parser cannot read
whole (malformed JSON, say) is plain content, never an error.

``tool_choice`` as vLLM has it: ``"auto"`` (the default with tools) parses; ``"none"`` never parses,
and the tools stay in the prompt unless the server runs with ``--exclude-tools-when-tool-choice-none``.
``"required"`` and a named function need decoding constrained to the tools' schemas, which this
server does not do: they are refused with a 400 that says so, never silently treated as ``"auto"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ludic.inference.server._json import BadRequest
from ludic.inference.tool_parsers import ParsedReply, ToolParser

TOOL_PARSER_KEY = web.AppKey("tool_parser", object)
"""The server's ``ToolParser``, or ``None`` (``--tool-parser none``, or no format detected)."""
EXCLUDE_TOOLS_KEY = web.AppKey("exclude_tools_when_none", bool)


class ToolParserError(RuntimeError):
    """The server's tool parser failed on a reply (a bug in the parser: HTTP 500 naming it)."""


@dataclass(frozen=True)
class ToolMode:
    """What a chat request asks of tools: render them into the prompt? read calls out of the reply?"""

    render_tools: bool
    parse_calls: bool


def tool_mode(body: dict[str, Any], *, have_parser: bool, exclude_when_none: bool) -> ToolMode:
    """The request's ``tool_choice`` as a ``ToolMode``; BadRequest for the choices not supported."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return ToolMode(render_tools=bool(tools) and not exclude_when_none, parse_calls=False)
    if choice == "auto":
        return ToolMode(render_tools=bool(tools), parse_calls=bool(tools) and have_parser)
    if choice == "required":
        raise BadRequest("tool_choice='required' is not supported by Ludic's server: forcing a call needs decoding "
                         "constrained to the tools' schemas, which it does not do. Send tool_choice='auto' "
                         "(calls the model writes come back as tool_calls) or 'none'")  # fmt: skip
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        raise BadRequest(f"tool_choice naming the function {str(name)[:80]!r} is not supported by Ludic's server: "
                         "forcing a call needs constrained decoding, which it does not do. Send "
                         "tool_choice='auto' or 'none'")  # fmt: skip
    raise BadRequest(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                     f"{{'name': ...}}}}, got {choice!r:.80}")  # fmt: skip


def read_reply(text: str, finish_reason: str | None, parser: ToolParser | None, mode: ToolMode) -> tuple[ParsedReply, str | None]:
    """The reply as (content, calls) and the finish reason the response carries."""
    if parser is None or not mode.parse_calls:
        return ParsedReply(text, []), finish_reason
    try:
        parsed = parser.parse(text)
    except Exception as exc:  # a parser's bug is the server's fault (500), never the request's (400)
        raise ToolParserError(f"tool parser {getattr(parser, 'name', parser)!r} raised on a reply: "
                              f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    if not isinstance(parsed, ParsedReply):
        raise ToolParserError(f"tool parser {getattr(parser, 'name', parser)!r} returned a "
                              f"{type(parsed).__name__}, not a ParsedReply")  # fmt: skip
    if parsed.tool_calls and finish_reason == "stop":
        return parsed, "tool_calls"
    return parsed, finish_reason


def assistant_message(parsed: ParsedReply) -> dict[str, Any]:
    """The OpenAI ``message`` of a reply (``tool_calls`` only when there are calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in parsed.tool_calls]
    return message
