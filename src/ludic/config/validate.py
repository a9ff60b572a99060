"""Type-check plain TOML/YAML data against a dataclass, reporting every error with its file and key.

Errors read ``config.toml: [trainer].lr: expected float, got str 'abc'``; all of a file's
errors are collected and raised together as one :class:`ConfigError` so a user fixes them in
one pass, and nothing is built until the whole file is valid.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
_MISSING = dataclasses.MISSING


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
    if annotation is Any:
        return "any value"
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in get_args(annotation) if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    if dataclasses.is_dataclass(annotation):
        return f"table ({annotation.__name__})"
    return getattr(annotation, "__name__", str(annotation))


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` (plain TOML/YAML data) fits ``annotation``; ints count as floats."""
    if annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return value in get_args(annotation)
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        return not args or all(_matches(v, args[0]) for v in value)
    if origin in (dict, Mapping) or annotation is dict:
        if not isinstance(value, Mapping):
            return False
        args = get_args(annotation)
        return not args or all(_matches(v, args[1]) for v in value.values())
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # an annotation we cannot check (a Protocol, a callable): accept


def _dataclass_in(annotation: Any) -> type | None:
    """The dataclass inside ``X`` or ``X | None``, if any."""
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        for a in get_args(annotation):
            if dataclasses.is_dataclass(a) and isinstance(a, type):
                return a
    return None


def build_dataclass(cls: type[T], data: Any, *, file: str, section: str = "") -> T:
    """Validate ``data`` against ``cls``'s fields and build it, or raise :class:`ConfigError`."""
    errors: list[str] = []
    obj = _build(cls, data, file=file, section=section, errors=errors)
    if errors:
        raise ConfigError(errors)
    return obj  # type: ignore[return-value]


def _build(cls: type, data: Any, *, file: str, section: str, errors: list[str]) -> Any:
    where = f"[{section}]" if section else "top level"
    if not isinstance(data, Mapping):
        errors.append(f"{file}: {where}: expected a table, got {_describe(data)}")
        return None
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    n_before = len(errors)
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            errors.append(f"{file}: {key_path(section, str(key))}: unknown key; known keys: {known}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        annotation = hints.get(name, Any)
        if name not in data:
            if f.default is _MISSING and f.default_factory is _MISSING:
                errors.append(
                    f"{file}: {key_path(section, name)}: missing required key (expected {type_name(annotation)})"
                )
            continue
        value = data[name]
        sub = _dataclass_in(annotation)
        if sub is not None and isinstance(value, Mapping):
            child = f"{section}.{name}" if section else name
            kwargs[name] = _build(sub, value, file=file, section=child, errors=errors)
        elif not _matches(value, annotation):
            errors.append(
                f"{file}: {key_path(section, name)}: expected {type_name(annotation)}, got {_describe(value)}"
            )
        else:
            kwargs[name] = _coerce(value, annotation)
    if len(errors) > n_before:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # the dataclass's own __post_init__ checks
        errors.append(f"{file}: {where}: {exc}")
        return None


def _coerce(value: Any, annotation: Any) -> Any:
    """Turn YAML/TOML lists into tuples where the field wants a tuple, ints into floats for floats."""
    if annotation is float and isinstance(value, int):
        return float(value)
    if get_origin(annotation) is tuple and isinstance(value, list):
        return tuple(value)
    return value
