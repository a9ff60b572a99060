"""Tool parsers by name, and the choice of one for a chat template.

Built in: ``hermes`` (Qwen, Hermes, Ludic's tiny ChatML), ``llama3_json``, ``mistral``. A user's own
parser is registered with ``register_tool_parser(name, factory)`` in Python, or named on the
server's command line as ``--tool-parser my_module:MyParser`` (imported, then called with no
arguments). ``auto`` looks for each format's marker in the chat template; ``none`` never parses.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ludic.inference.tool_parsers.base import ToolParser
from ludic.inference.tool_parsers.hermes import HermesToolParser
from ludic.inference.tool_parsers.llama3 import PYTHON_TAG, Llama3JsonToolParser
from ludic.inference.tool_parsers.mistral import MARKER as MISTRAL_MARKER
from ludic.inference.tool_parsers.mistral import MistralToolParser

ParserFactory = Callable[[], ToolParser]

_REGISTRY: dict[str, ParserFactory] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}
CHOICES = ("auto", "none")
"""Names ``resolve_tool_parser`` takes besides the registered parsers and ``module:attr``."""

TEMPLATE_MARKERS: tuple[tuple[str, str], ...] = (
    (MISTRAL_MARKER, "mistral"),  # before <tool_call>: the marker is unambiguous
    ("<tool_call>", "hermes"),
    (PYTHON_TAG, "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),  # Llama 3.x JSON tool prompt
)
"""Text in a chat template that names its tool-call format, checked in order."""


def register_tool_parser(name: str, factory: ParserFactory, *, replace: bool = False) -> None:
    """Make ``factory()`` the parser called ``name`` (``--tool-parser name`` once the module is imported)."""
    if not name or ":" in name or name in CHOICES:
        raise ValueError(f"tool parser name {name!r} is empty, holds ':' or is reserved ({', '.join(CHOICES)})")
    if name in _REGISTRY and not replace:
        raise ValueError(f"a tool parser called {name!r} is already registered (pass replace=True to override)")
    _REGISTRY[name] = factory


def tool_parser_names() -> list[str]:
    return sorted(_REGISTRY)


def get_tool_parser(name: str) -> ToolParser:
    """A registered parser, or one imported from ``module:attr``; ValueError naming the choices otherwise."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"tool parser {name!r} cannot be imported: {exc}") from exc
    elif name in _REGISTRY:
        factory = _REGISTRY[name]
    else:
        raise ValueError(f"unknown tool parser {name!r}: choose one of {', '.join([*CHOICES, *tool_parser_names()])} "
                         "or module:attr")  # fmt: skip
    parser = factory()
    if not isinstance(parser, ToolParser):
        raise ValueError(f"tool parser {name!r} made a {type(parser).__name__}, which has no name and parse(text)")
    return parser


def detect_tool_parser(chat_template: str | None) -> str | None:
    """The name of the format a chat template teaches, or ``None`` when it names none Ludic knows."""
    for marker, name in TEMPLATE_MARKERS:
        if chat_template and marker in chat_template:
            return name
    return None


def resolve_tool_parser(name: str, chat_template: str | None) -> tuple[ToolParser | None, str]:
    """The parser ``--tool-parser name`` selects for this template, and a line saying why (for the log)."""
    if name == "none":
        return None, "tool parser: none (--tool-parser none): replies are never read for tool calls"
    if name == "auto":
        detected = detect_tool_parser(chat_template)
        if detected is None:
            return None, ("tool parser: none (the chat template shows no known tool-call format; pass "
                          f"--tool-parser with one of {', '.join(tool_parser_names())} or module:attr)")  # fmt: skip
        return get_tool_parser(detected), f"tool parser: {detected} (detected from the chat template)"
    return get_tool_parser(name), f"tool parser: {name} (--tool-parser)"
