"""Tools as JSON schema, built from typed Python callables (the OpenAI ``tools=`` shape).

``Tool.from_callable(fn)`` reads the signature and type hints: ``int`` -> ``integer``,
``float`` -> ``number``, ``str``/``bool``, ``list[X]``/``tuple[X, ...]`` -> ``array``,
``dict`` -> ``object``, ``Literal[...]`` -> ``enum``, ``X | None`` -> X (nullable). A parameter
without a default is ``required``. The description is the docstring's first paragraph;
parameter descriptions come from a Google-style ``Args:`` section when there is one.
``tool.schema`` is what chat templates take as ``tools=[...]`` and servers as ``"tools"``.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_SCALARS: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


@dataclass(frozen=True)
class Tool:
    """A callable the model may call. ``concurrent``: calls to it may run at the same time."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False)
    concurrent: bool = False

    @classmethod
    def from_callable(
        cls, fn: Callable[..., Any], *, name: str | None = None, concurrent: bool = False
    ) -> Tool:
        if not callable(fn):
            raise TypeError(f"tool {name or fn!r} is not callable: {fn!r}")
        tool_name = name or getattr(fn, "__name__", None)
        if not tool_name or not re.fullmatch(r"[A-Za-z_][\w\-.]*", tool_name):
            raise ValueError(f"tool name must be an identifier-like string, got {tool_name!r}")
        summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        return cls(
            name=tool_name,
            description=summary,
            parameters=_parameters_schema(fn, tool_name, arg_docs),
            fn=fn,
            concurrent=concurrent,
        )

    @property
    def schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def as_tools(tools: Sequence[Callable[..., Any] | Tool] | Mapping[str, Callable[..., Any] | Tool]) -> dict[str, Tool]:
    """Normalise a list of callables/Tools (or a name -> callable mapping) to name -> Tool."""
    items = tools.items() if isinstance(tools, Mapping) else [(None, t) for t in tools]
    out: dict[str, Tool] = {}
    for name, t in items:
        tool = t if isinstance(t, Tool) else Tool.from_callable(t, name=name)
        if name is not None and tool.name != name:
            tool = Tool(name, tool.description, tool.parameters, tool.fn, tool.concurrent)
        if tool.name in out:
            raise ValueError(f"two tools are named {tool.name!r}")
        out[tool.name] = tool
    return out


def json_schema_for(annotation: Any, where: str) -> dict[str, Any]:
    """JSON schema of one type hint; raises naming ``where`` for a type it cannot describe."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            schema = json_schema_for(inner[0], where)
            return {**schema, "nullable": True} if len(args) > 1 else schema
        return {"anyOf": [json_schema_for(a, where) for a in args]}
    if annotation in (list, tuple) or origin in (list, tuple, Sequence):
        item = args[0] if args else Any
        return {"type": "array", "items": json_schema_for(item, where)}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    raise TypeError(f"{where}: cannot describe type {annotation!r} as JSON schema (use int, float, str, "
                    "bool, list[...], dict, Literal[...] or X | None)")  # fmt: skip


def _parameters_schema(fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str]) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        schema = json_schema_for(hints.get(pname, param.annotation), f"tool {tool_name!r} parameter {pname!r}")
        if pname in arg_docs:
            schema = {**schema, "description": arg_docs[pname]}
        properties[pname] = schema
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {"type": "object", "properties": properties, "required": required}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {arg: description}) from a Google-style docstring."""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if line.strip() and not line.startswith((" ", "\t")):
                break
            m = _ARG_LINE.match(line)
            if m:
                args[m.group(1)] = m.group(2).strip()
    return summary, args
