"""Turn pydantic's validation errors into one line per problem, naming the file, key and type.

Lines read ``config.toml: [trainer].lr: expected float, got str 'abc'``; a file's errors are
raised together as one :class:`ConfigError` so a user fixes them in one pass.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config file failed validation; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid config:\n  " + "\n  ".join(self.errors))


def key_path(section: str, key: str) -> str:
    """``[trainer].lr`` for a key in a table, ``steps`` for a top-level key."""
    return f"[{section}].{key}" if section else key


def type_name(annotation: Any) -> str:
    """A short human name for a type annotation (``float``, ``list[str]``, ``'a' | 'b'``)."""
    origin = get_origin(annotation)
    if annotation is Any:
        return "any value"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in get_args(annotation) if a is not Ellipsis)
        name = "table" if origin is dict else getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]"
    if annotation is type(None):
        return "None"
    if _fields(annotation):
        return f"table ({annotation.__name__})"
    return getattr(annotation, "__name__", str(annotation))


def describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _fields(cls: Any) -> dict[str, Any]:
    """Field name -> annotation of a pydantic model or dataclass (``{}`` for anything else)."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {name: f.annotation for name, f in cls.model_fields.items()}
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        hints = get_type_hints(cls)
        return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}
    return {}


def _table_in(annotation: Any) -> Any:
    """The model/dataclass inside ``X`` or ``X | None``, else None."""
    for candidate in (annotation, *get_args(annotation)):
        if _fields(candidate):
            return candidate
    return None


def _walk(root: type, loc: tuple[Any, ...]) -> tuple[list[str], Any, Any]:
    """Follow ``loc`` through the schema: (key names matched, their annotation, enclosing table)."""
    keys: list[str] = []
    table: Any = root
    annotation: Any = root
    for part in loc:
        fields = _fields(table)
        if part not in fields:
            break  # a union member tag or an unknown key: stop at the last real key
        keys.append(part)
        annotation = fields[part]
        inner = _table_in(annotation)
        if inner is None:
            break
        table = inner
    return keys, annotation, table


def format_errors(exc: ValidationError, root: type, *, file: str) -> list[str]:
    """One line per (key, problem); union members' alternatives collapse into one line."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        keys, annotation, table = _walk(root, loc)
        kind = err["type"]
        if kind in ("extra_forbidden", "unexpected_keyword_argument"):
            known = ", ".join(sorted(_fields(table)))
            section = ".".join(keys)
            line = f"{key_path(section, str(loc[len(keys)]))}: unknown key; known keys: {known}"
        elif kind == "missing":
            line = f"{key_path('.'.join(keys[:-1]), keys[-1])}: missing required key (expected {type_name(annotation)})"
        elif kind in ("value_error", "assertion_error"):
            where = f"[{'.'.join(keys)}]" if keys else "top level"
            line = f"{where}: {err['msg'].removeprefix('Value error, ').removeprefix('Assertion failed, ')}"
        else:
            section, name = ".".join(keys[:-1]), keys[-1] if keys else "top level"
            got = err["input"]
            line = f"{key_path(section, name)}: expected {type_name(annotation)}, got {describe(got)}"
        line = f"{file}: {line}"
        if line not in lines:
            lines.append(line)
    return lines
