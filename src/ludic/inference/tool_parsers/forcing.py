"""What a tool parser adds for ``tool_choice`` and streaming: the text that forces a call, and where calls start.

Ludic's engine has no grammar engine, so ``tool_choice="required"`` or a named function is honoured by
*prefilling*: the reply starts with the format's opening of a call (Hermes ``<tool_call>{"name": "calc",
"arguments": `` for ``calc``) and the model writes the rest, which the parser then reads as for any reply.
A streamed reply sends its text as content until a call may have started (``call_start``); the calls
themselves stream through ``partial_calls`` (``streaming.py``), and the content after them waits for the end.

Both are optional methods of a parser (``forced_prefix(function, chat_template)``, ``call_start(text)``);
a parser of your own without them cannot force calls (``tool_choice`` other than auto/none is refused
naming it) and streams no content before the reply ends (all of it is sent, read, at the end).
"""

from __future__ import annotations

from typing import Any


class CannotForce(ValueError):
    """The server's tool parser has no ``forced_prefix``: ``tool_choice`` cannot be honoured (HTTP 400)."""


def forced_prefix(parser: Any, function: str | None, chat_template: str | None) -> str:
    """The text the reply is prefilled with: a call's opening (of ``function``, or of any call when None)."""
    method = getattr(parser, "forced_prefix", None)
    if method is None:
        raise CannotForce(f"the server's tool parser {getattr(parser, 'name', parser)!r} has no forced_prefix("
                          "function, chat_template), so it cannot force a call: send tool_choice='auto' or 'none'")  # fmt: skip
    prefix = method(function, chat_template)
    if not isinstance(prefix, str) or not prefix:
        raise CannotForce(f"tool parser {getattr(parser, 'name', parser)!r}: forced_prefix returned {prefix!r:.80}, "
                          "not a non-empty string")  # fmt: skip
    return prefix


def call_start(parser: Any, text: str) -> int:
    """How much of ``text`` (a reply so far) is surely content: the index where a call starts or may start."""
    method = getattr(parser, "call_start", None)
    if method is None:
        return 0
    at = method(text)
    return max(0, min(int(at), len(text)))


def marker_start(text: str, marker: str) -> int:
    """Where ``marker`` starts in ``text``, or where a suffix of ``text`` that begins ``marker`` starts, or ``len(text)``."""
    at = text.find(marker)
    if at != -1:
        return at
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return len(text) - size
    return len(text)
