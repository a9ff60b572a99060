"""Parsers turn raw model text into an action plus an intrinsic format reward.

A parser is any ``Callable[[str], ParseResult]``. On success ``action`` is the extracted
action; on failure it is ``None`` and ``obs`` tells the agent what was expected (the
protocol feeds it back as a user message and does not step the env). ``reward`` is a
format reward or penalty that the protocol adds to the env's reward.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ParseResult:
    """``action`` is None on failure; ``obs`` is then the feedback shown to the agent."""

    action: str | None
    reward: float = 0.0
    obs: str | None = None


Parser = Callable[[str], ParseResult]


def xml_tag_parser(
    tag: str, exact: bool = False, success_reward: float = 0.0, error_reward: float = -1.0
) -> Parser:
    """Extract the content of ``<tag>...</tag>`` (tag names match case-insensitively).

    exact=False: the last such block anywhere in the text is used (models often think first).
    exact=True: the whole reply, stripped, must be exactly one ``<tag>...</tag>`` block.
    Empty content is a failure too. Runs in time linear in the reply, whatever it holds.
    """
    if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w\-.]*", tag):
        raise ValueError(f"xml_tag_parser: tag must be an XML name like 'move', got {tag!r}")
    marker = re.compile(rf"<(/?){re.escape(tag)}>", re.IGNORECASE)
    where = "as your whole reply" if exact else "in your reply"
    expected = f"Expected <{tag}>...</{tag}> {where}, e.g. <{tag}>your answer</{tag}>."

    def parse(text: str) -> ParseResult:
        content = _exact_block(text.strip(), marker) if exact else _last_block(text, marker)
        if content is None:
            return ParseResult(action=None, reward=error_reward, obs=f"Invalid format. {expected}")
        content = content.strip()
        if not content:
            return ParseResult(
                action=None, reward=error_reward, obs=f"Empty <{tag}></{tag}> block. {expected}"
            )
        return ParseResult(action=content, reward=success_reward, obs=None)

    parse.__name__ = f"xml_tag_parser_{tag}"
    return parse


def _last_block(text: str, marker: re.Pattern[str]) -> str | None:
    """The content of the last ``<tag>...</tag>`` pair, pairing each opening with the first
    closing after it (as a lazy regex would), in one left-to-right pass over the tag markers."""
    last, open_end = None, -1
    for m in marker.finditer(text):
        if not m.group(1):
            if open_end < 0:
                open_end = m.end()
        elif open_end >= 0:
            last, open_end = (open_end, m.start()), -1
    return None if last is None else text[last[0] : last[1]]


def _exact_block(text: str, marker: re.Pattern[str]) -> str | None:
    """The content when ``text`` is exactly one ``<tag>...</tag>`` block, its opening paired with the
    first closing after it (as in :func:`_last_block`), so ``<a>1</a><a>2</a>`` is two blocks, not one
    holding ``1</a><a>2``."""
    first = marker.match(text)
    if first is None or first.group(1):
        return None
    closing = next((m for m in marker.finditer(text, first.end()) if m.group(1)), None)
    if closing is None or closing.end() != len(text):
        return None
    return text[first.end() : closing.start()]


xml_parser = xml_tag_parser


THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
"""An opening or closing think tag in any case (group 1 is ``/`` for a closing one); ``think_prefix_parser``
and ``ludic.context.strip_thinking`` read the same markers."""


def think_prefix_parser(success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
    """Require the reply to start with ``<think>...</think>``; the action is what follows it.

    The block ends at the first closing tag. Tag names match case-insensitively (``<Think>``, ``<THINK>``),
    as in :func:`xml_tag_parser` and in ``ludic.context.strip_thinking``, which removes the same blocks.
    """
    expected = "Expected your reply to start with <think>...</think> followed by your answer."

    def parse(text: str) -> ParseResult:
        head = text.lstrip()
        opening = THINK_TAG.match(head)
        closing = None
        if opening is not None and not opening.group(1):
            closing = next((m for m in THINK_TAG.finditer(head, opening.end()) if m.group(1)), None)
        if closing is None:
            return ParseResult(action=None, reward=error_reward, obs=f"Invalid format. {expected}")
        answer = head[closing.end() :].strip()
        if not answer:
            return ParseResult(action=None, reward=error_reward, obs=f"No answer after </think>. {expected}")
        return ParseResult(action=answer, reward=success_reward, obs=None)

    return parse


_BRACE = re.compile(r"\\[\\{}]|[{}]")  # a brace, or an escaped brace or backslash (\{ \} \\), which is none


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{``, up to the brace that closes it; None if absent or unclosed.

    Braces nest (``\\boxed{\\frac{1}{2}}``); LaTeX's escaped braces are content, not nesting
    (``\\boxed{\\{1, 2\\}}``, ``\\boxed{\\left\\{ x \\right.}``), and ``\\\\}`` is a line break then a closing
    brace. One pass over the braces after the last ``\\boxed{``: linear in the reply.
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    begin = start + len("\\boxed{")
    depth = 1
    for m in _BRACE.finditer(text, begin):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
            if depth == 0:
                return text[begin : m.start()]
    return None


def boxed_parser(success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
    """Extract the answer in the last ``\\boxed{...}`` (the MATH benchmark's convention); braces nest.

    Only the last ``\\boxed{`` counts: when it never closes, as in a reply cut off by the token limit
    (``\\boxed{12} so the answer is \\boxed{1``), the reply is a format error, not ``12``, an answer the
    model went on to replace. Escaped braces (``\\{``, ``\\}``) are content, not nesting. An empty box is a
    format error. Only ``\\boxed{`` is read (not ``\\boxed {`` or ``\\fbox{``).
    """
    expected = "Expected the final answer as \\boxed{...}, e.g. \\boxed{42}."

    def parse(text: str) -> ParseResult:
        content = last_boxed(text)
        if content is None or not content.strip():
            return ParseResult(action=None, reward=error_reward, obs=f"Invalid format. {expected}")
        return ParseResult(action=content.strip(), reward=success_reward, obs=None)

    return parse


def compose_parsers(*parsers: Parser) -> Parser:
    """Chain parsers: each one parses the previous one's action; rewards add up.

    The first failure stops the chain and returns its obs, with the rewards so far included.
    E.g. ``compose_parsers(think_prefix_parser(), xml_tag_parser("move"))``.
    """
    if not parsers:
        raise ValueError("compose_parsers needs at least one parser")
    for i, p in enumerate(parsers):
        if not callable(p):
            raise TypeError(f"compose_parsers: argument {i} is not callable: {p!r}")

    def parse(text: str) -> ParseResult:
        current = text
        total = 0.0
        for p in parsers:
            result = p(current)
            total += result.reward
            if result.action is None:
                return ParseResult(action=None, reward=total, obs=result.obs)
            current = result.action
        return ParseResult(action=current, reward=total, obs=None)

    return parse


__all__ = [
    "ParseResult",
    "Parser",
    "boxed_parser",
    "compose_parsers",
    "last_boxed",
    "think_prefix_parser",
    "xml_parser",
    "xml_tag_parser",
]
