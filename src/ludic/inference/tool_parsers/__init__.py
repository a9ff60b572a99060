"""Tool-call parsers: read the calls a model wrote in its chat template's format as OpenAI ``tool_calls``."""

from ludic.inference.tool_parsers.base import ParsedReply, ParsedToolCall, ToolParser
from ludic.inference.tool_parsers.hermes import HermesToolParser
from ludic.inference.tool_parsers.llama3 import Llama3JsonToolParser
from ludic.inference.tool_parsers.mistral import MistralToolParser
from ludic.inference.tool_parsers.registry import (
    detect_tool_parser,
    get_tool_parser,
    register_tool_parser,
    resolve_tool_parser,
    tool_parser_names,
)
from ludic.inference.tool_parsers.streaming import PartialCall, read_call_object

__all__ = [
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "ParsedReply",
    "ParsedToolCall",
    "PartialCall",
    "ToolParser",
    "detect_tool_parser",
    "get_tool_parser",
    "read_call_object",
    "register_tool_parser",
    "resolve_tool_parser",
    "tool_parser_names",
]
