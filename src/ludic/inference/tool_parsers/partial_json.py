"""Reading JSON that is still being written: what a tool call's arguments are sure to be, before they end.

A non-streamed call's ``arguments`` are ``json.dumps(args, ensure_ascii=False)`` of the object the model
wrote (``base.call_from_object``), not the model's own spelling. To stream them as they are decoded and
still have the fragments add up to exactly that text, the written prefix is re-spelt token by token the
way ``json.dumps`` spells the whole, and only what later text cannot change is given out: a number or a
literal once a delimiter follows it (``1`` may become ``12``), a string up to its last whole character
(an escape still missing characters, or a high surrogate waiting for its pair, waits). A key written
twice would make ``json.loads`` overwrite an earlier value, so parsers refuse it (``strict_loads``) and
the reader calls it malformed.
"""

from __future__ import annotations

import json
from typing import Any

WHITESPACE = " \t\n\r"
LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")  # what Python's json.loads accepts
NUMBER_CHARS = frozenset("0123456789+-.eE")


class Incomplete(Exception):
    """The text ended inside the value."""


class Malformed(ValueError):
    """The text is not the start of a JSON value ``json.loads`` would accept."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        raise ValueError(f"key {next(k for k in keys if keys.count(k) > 1)!r} appears twice in one object")
    return out


STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)
"""``json.JSONDecoder`` that refuses an object with a key twice (its ``raw_decode`` for several values)."""


def strict_loads(text: str) -> Any:
    """``json.loads`` that refuses an object holding a key twice (ValueError), as the stream reader does."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def canonical_prefix(text: str) -> tuple[str, bool]:
    """``json.dumps`` spelling of what the JSON value at the start of ``text`` is sure to begin with, and
    whether the value is whole. Raises ``Malformed`` when ``text`` cannot begin a value."""
    out: list[str] = []
    try:
        value(text, 0, out)
    except Incomplete:
        return "".join(out), False
    return "".join(out), True


def value(text: str, i: int, out: list[str]) -> int:
    """Append the canonical spelling of the value at ``text[i:]`` to ``out``; the index after it."""
    i = skip_ws(text, i)
    if i >= len(text):
        raise Incomplete
    c = text[i]
    if c == "{":
        return _container(text, i, out, "}", keyed=True)
    if c == "[":
        return _container(text, i, out, "]", keyed=False)
    if c == '"':
        return string(text, i, out)[0]
    return _scalar(text, i, out)


def _container(text: str, i: int, out: list[str], close: str, *, keyed: bool) -> int:
    out.append(text[i])
    keys: set[str] = set()
    i = skip_ws(text, i + 1)
    if i < len(text) and text[i] == close:
        out.append(close)
        return i + 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            raise Incomplete
        if keyed:
            i, _ = key_and_colon(text, i, keys, out)
            out.append(": ")
        i = skip_ws(text, value(text, i, out))
        if i >= len(text):
            raise Incomplete
        if text[i] == close:
            out.append(close)
            return i + 1
        if text[i] != ",":
            raise Malformed(f"expected ',' or {close!r} at {i}")
        out.append(", ")
        i += 1


def key_and_colon(text: str, i: int, keys: set[str], out: list[str]) -> tuple[int, str]:
    """Read an object's key at ``i`` (spelt into ``out``, added to ``keys``) and the ``:`` after it: the index
    after the colon, and the key. A key already in ``keys`` is malformed (``json.loads`` would overwrite its value)."""
    if text[i] != '"':
        raise Malformed(f"expected a key at {i}")
    i, key = string(text, i, out)
    if key in keys:
        raise Malformed(f"key {key!r} appears twice in one object")
    keys.add(key)
    i = skip_ws(text, i)
    if i >= len(text):
        raise Incomplete
    if text[i] != ":":
        raise Malformed(f"expected ':' at {i}")
    return i + 1, key


def string(text: str, i: int, out: list[str]) -> tuple[int, str]:
    """A string at ``text[i]`` (``"``): its end and decoded value; a cut one appends its sure part and raises."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == '"':
            try:
                decoded = json.loads(text[i : j + 1])
            except ValueError as exc:
                raise Malformed(str(exc)) from exc
            out.append(json.dumps(decoded, ensure_ascii=False))
            return j + 1, decoded
        j += 2 if c == "\\" else 1
    cut = _whole_characters(text, i + 1)
    try:
        decoded = json.loads(text[i:cut] + '"')
    except ValueError as exc:
        raise Malformed(str(exc)) from exc
    out.append(json.dumps(decoded, ensure_ascii=False)[:-1])
    raise Incomplete


def _whole_characters(text: str, start: int) -> int:
    """Where the last whole character of an unfinished string body ``text[start:]`` ends."""
    j = start
    while j < len(text):
        if text[j] != "\\":
            j += 1
            continue
        size = 6 if text[j + 1 : j + 2] == "u" else 2
        if j + size > len(text):
            return j
        if size == 6 and 0xD800 <= _hex(text[j + 2 : j + 6]) <= 0xDBFF:
            if j + 12 > len(text):  # a high surrogate: its pair decides the character
                return j
            size = 12 if text[j + 6 : j + 8] == "\\u" else 6
        j += size
    return j


def _hex(digits: str) -> int:
    try:
        return int(digits, 16)
    except ValueError as exc:
        raise Malformed(f"bad \\u escape {digits!r}") from exc


def _scalar(text: str, i: int, out: list[str]) -> int:
    rest = text[i : i + 9]
    for literal in LITERALS:
        if rest.startswith(literal):
            out.append(json.dumps(json.loads(literal)))
            return i + len(literal)
    if any(literal.startswith(rest) for literal in LITERALS) and i + len(rest) == len(text):
        raise Incomplete
    j = i
    while j < len(text) and text[j] in NUMBER_CHARS:
        j += 1
    if j == len(text):
        raise Incomplete  # a number is whole only once something follows it
    try:
        number = json.loads(text[i:j])
    except ValueError as exc:
        raise Malformed(f"not a JSON value at {i}: {text[i : i + 20]!r}") from exc
    out.append(json.dumps(number))
    return j
