"""How deep a run config may nest, checked without recursion so a deep file cannot overflow the stack."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic.config.errors import ConfigError, key_path

MAX_CONFIG_DEPTH = 32
"""Tables and lists a value may sit inside; a run config is a few levels deep, and deeper data would hit
the JSON parser's and Python's recursion limits with a misleading error."""


def depth_error(file: str, keys: Sequence[str], line: int | None = None) -> ConfigError:
    """The error for a value nested past ``MAX_CONFIG_DEPTH``, naming its key (and line, when known)."""
    where = key_path(".".join(keys[:-1]), keys[-1]) if keys else ""
    where = where if len(where) <= 60 else where[:57] + "..."
    if line is not None:
        where = f"{where} (line {line})" if where else f"line {line}"
    return ConfigError(
        [f"{file}: {where or 'top level'}: nested more than {MAX_CONFIG_DEPTH} tables/lists deep "
         f"(limit {MAX_CONFIG_DEPTH}); flatten the value"]
    )  # fmt: skip


def check_depth(data: Mapping[str, Any], file: str) -> None:
    """ConfigError naming the first key whose value nests past ``MAX_CONFIG_DEPTH`` tables/lists.

    Iterative, so a deep (or, through a recursive YAML alias, circular) value cannot overflow the stack.
    """
    stack: list[tuple[Any, tuple[str, ...], int]] = [(data, (), 0)]
    while stack:
        value, keys, depth = stack.pop()
        if not isinstance(value, (Mapping, list, tuple)):
            continue
        if depth > MAX_CONFIG_DEPTH:
            raise depth_error(file, keys)
        children = value.items() if isinstance(value, Mapping) else ((None, v) for v in value)
        stack.extend((v, keys if k is None else (*keys, str(k)), depth + 1) for k, v in children)


def check_toml_depth(text: str, file: str) -> None:
    """Refuse inline arrays/tables nested past ``MAX_CONFIG_DEPTH`` before ``tomllib`` (which recurses)
    sees them, naming the line; strings and comments are skipped so their brackets do not count."""
    if text.count("[") + text.count("{") <= MAX_CONFIG_DEPTH:
        return  # cannot nest that deep: skip the scan
    depth, line, i = 0, 1, 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            end = _string_end(text, i)
            line += text.count("\n", i, end)
            i = end
            continue
        if c == "#":
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if c == "\n":
            line += 1
        elif c in "[{":
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                raise depth_error(file, [], line)
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1


def _string_end(text: str, start: int) -> int:
    """Index just past the TOML string starting at ``start`` (basic or literal, one- or multi-line)."""
    quote = text[start]
    delim = quote * 3 if text.startswith(quote * 3, start) else quote
    i = start + len(delim)
    while i < len(text):
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if text.startswith(delim, i):
            return i + len(delim)
        if text[i] == "\n" and len(delim) == 1:
            return i  # unterminated: tomllib reports it
        i += 1
    return i
