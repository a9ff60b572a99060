"""Tool calls on the chat route: ``tool_choice`` honoured, and the reply read by the server's tool parser.

The parser (``--tool-parser``, ``auto`` by default: detected from the chat template) turns a reply
that holds calls in the template's format into OpenAI ``tool_calls``: ``content`` is the text
outside the calls (``null`` when there is none) and ``finish_reason`` is ``"tool_calls"`` (a reply
cut at ``max_tokens`` keeps ``"length"``). Only the message changes: ``token_ids`` and log-probs stay
those of the whole reply, which is what is recorded and trained. A reply the parser cannot read
whole (malformed JSON, say) is plain content, never an error.

``tool_choice`` as vLLM has it: ``"auto"`` (the default with tools) parses; ``"none"`` never parses,
and the tools stay in the prompt unless the server runs with ``--exclude-tools-when-tool-choice-none``.
``"required"`` and a named function force a call. vLLM constrains decoding to the tools' schemas; this
server has no grammar engine, so it *prefills* the reply with the format's opening of a call
(``inference/tool_parsers/forcing.py``) and the model writes the rest. The prefilled tokens were not
sampled, so they are prompt tokens (``prompt_token_ids`` ends with them; ``choices[0].forced_token_ids``
names them), never action tokens: no log-prob, no policy-gradient credit. A continuation that does not
read as calls to the allowed functions comes back as plain content with ``tool_choice_unmet`` saying
why (the sampled ids stay trainable, as any reply's; a grammar would have made it impossible).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ludic.inference.server._json import BadRequest
from ludic.inference.tool_parsers import ParsedReply, ToolParser
from ludic.inference.tool_parsers.forcing import CannotForce, forced_prefix

TOOL_PARSER_KEY = web.AppKey("tool_parser", object)
"""The server's ``ToolParser``, or ``None`` (``--tool-parser none``, or no format detected)."""
EXCLUDE_TOOLS_KEY = web.AppKey("exclude_tools_when_none", bool)


class ToolParserError(RuntimeError):
    """The server's tool parser failed on a reply (a bug in the parser: HTTP 500 naming it)."""


@dataclass(frozen=True)
class ToolMode:
    """What a chat request asks of tools: render them into the prompt? read calls out of the reply?
    Force one (``forced``: the function's name, or ``""`` for any of ``allowed``)?"""

    render_tools: bool
    parse_calls: bool
    forced: str | None = None
    allowed: frozenset[str] = frozenset()


def tool_names(tools: Any) -> list[str]:
    """The function names of a request's ``tools`` (entries without one are skipped)."""
    names = []
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return names


def tool_mode(body: dict[str, Any], *, have_parser: bool, exclude_when_none: bool) -> ToolMode:
    """The request's ``tool_choice`` as a ``ToolMode``; BadRequest for a choice it cannot honour."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return ToolMode(render_tools=bool(tools) and not exclude_when_none, parse_calls=False)
    if choice == "auto":
        return ToolMode(render_tools=bool(tools), parse_calls=bool(tools) and have_parser)
    if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
        names = tool_names(tools)
        if not names:
            raise BadRequest(f"tool_choice={choice!r:.80} needs tools: the request's tools name no function")
        if not have_parser:
            raise BadRequest(f"tool_choice={choice!r:.80} needs a tool parser to read the call, and the server has "
                             "none (--tool-parser none, or none detected from the chat template)")  # fmt: skip
        if choice == "required":
            return ToolMode(render_tools=True, parse_calls=True, forced="", allowed=frozenset(names))
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in names:
            raise BadRequest(f"tool_choice names the function {str(name)[:80]!r}, which is not among the request's "
                             f"tools ({', '.join(names)[:200]})")  # fmt: skip
        return ToolMode(render_tools=True, parse_calls=True, forced=name, allowed=frozenset({name}))
    raise BadRequest(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                     f"{{'name': ...}}}}, got {choice!r:.80}")  # fmt: skip


def prefill_text(parser: ToolParser | None, mode: ToolMode, chat_template: str | None) -> str:
    """The text a forced call's reply starts with ("" when nothing is forced); BadRequest if the parser cannot."""
    if mode.forced is None or parser is None:
        return ""
    try:
        return forced_prefix(parser, mode.forced or None, chat_template)
    except CannotForce as exc:
        raise BadRequest(str(exc)) from exc


def unmet(parsed: ParsedReply, mode: ToolMode) -> str | None:
    """Why a forced reply does not satisfy ``tool_choice`` (None when it does, or nothing was forced)."""
    if mode.forced is None:
        return None
    if not parsed.tool_calls:
        return "the model's continuation of the forced call does not read as a tool call"
    stray = sorted({c.name for c in parsed.tool_calls} - mode.allowed)
    if stray:
        return f"the reply calls {', '.join(stray)[:200]}, not among the functions tool_choice allows"
    return None


def read_reply(text: str, finish_reason: str | None, parser: ToolParser | None, mode: ToolMode) -> tuple[ParsedReply, str | None]:
    """The reply as (content, calls) and the finish reason the response carries (a forced reply that
    does not meet ``tool_choice`` is plain content: see ``unmet``)."""
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
    if unmet(parsed, mode):
        return ParsedReply(text, []), finish_reason
    if parsed.tool_calls and finish_reason == "stop":
        return parsed, "tool_calls"
    return parsed, finish_reason


def assistant_message(parsed: ParsedReply) -> dict[str, Any]:
    """The OpenAI ``message`` of a reply (``tool_calls`` only when there are calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in parsed.tool_calls]
    return message
