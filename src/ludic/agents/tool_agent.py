"""An Agent that can call Python functions as tools before answering.

Tool-call format (documented to the model in the system message it sends):

    <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>

A reply with one or more tool calls is not an action: the calls run, each result is
recorded in the context as a ``{"role": "tool", "name": ..., "content": ...}`` message,
and the model is asked again. A reply without tool calls is the final reply and goes to
the parser. Missing tools, invalid JSON arguments and tool exceptions become tool
messages saying what went wrong, and the loop continues (seed behaviour note).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic.agents.base_agent import Agent
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import ParseResult
from ludic.types import ChatResponse, Message

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<keyword arguments as JSON>}}</tool_call>'


def parse_tool_calls(text: str) -> list[str]:
    """The raw JSON bodies of every ``<tool_call>`` block, in order."""
    return [m.strip() for m in TOOL_CALL.findall(text)]


def describe_tool(name: str, fn: Callable[..., Any]) -> str:
    """One line: ``name(signature): first docstring line``."""
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    return f"- {name}{inspect.signature(fn)}: {doc}".rstrip(": ")


class ToolAgent(Agent):
    """Agent + tools. ``tools``: callables (named by ``__name__``) or a name → callable mapping.

    max_tool_rounds: how many tool-call replies one ``act`` may execute before the next
    reply is taken as final whatever it contains. Tool messages are kept in the context.
    ``act`` info adds ``tool_calls`` (name, arguments, output, error per call) and
    ``tool_traces`` (token traces of the tool-call replies; the step's ``trace`` is the
    final reply's, which is the action).
    """

    def __init__(
        self,
        *,
        tools: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
        max_tool_rounds: int = 1,
        **agent_kwargs: Any,
    ) -> None:
        super().__init__(**agent_kwargs)
        if isinstance(tools, Mapping):
            self.tools = dict(tools)
        else:
            self.tools = {fn.__name__: fn for fn in tools}
        for name, fn in self.tools.items():
            if not callable(fn):
                raise TypeError(f"tool {name!r} is not callable: {fn!r}")
        if not isinstance(max_tool_rounds, int) or max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds must be an int >= 0, got {max_tool_rounds!r}")
        self.max_tool_rounds = max_tool_rounds

    # --- prompt --------------------------------------------------------------------------
    def tool_instructions(self) -> str:
        lines = "\n".join(describe_tool(n, fn) for n, fn in self.tools.items())
        return (
            f"You can call these tools:\n{lines}\nTo call a tool, reply with {CALL_FORMAT}. "
            "Tool results come back as tool messages. Reply without a tool call to answer."
        )

    def build_request(self, messages: list[Message], sampling: SamplingConfig) -> ChatCompletionRequest:
        """Add the tool instructions to the system message of what is sent (not to the history)."""
        msgs = [dict(m) for m in messages]
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = f"{msgs[0]['content']}\n\n{self.tool_instructions()}"
        else:
            msgs.insert(0, {"role": "system", "content": self.tool_instructions()})
        return super().build_request(msgs, sampling)  # type: ignore[arg-type]

    # --- acting --------------------------------------------------------------------------
    async def act(
        self, *, sampling: SamplingConfig | None = None, timeout_s: float | None = None
    ) -> tuple[ParseResult, dict[str, Any]]:
        calls_log: list[dict[str, Any]] = []
        tool_traces = []
        rounds = 0
        while True:
            response, client_info = await self.complete_once(sampling=sampling, timeout_s=timeout_s)
            self.ctx.on_after_act(response)
            bodies = parse_tool_calls(response.text)
            if not bodies or response.finish_reason == "length" or rounds >= self.max_tool_rounds:
                if bodies and rounds >= self.max_tool_rounds:
                    final = await self.on_tool_budget_exhausted(sampling=sampling, timeout_s=timeout_s)
                    if final is not None:
                        tool_traces.append(response.to_trace())
                        response, client_info = final
                break
            tool_traces.append(response.to_trace())
            for body in bodies:
                calls_log.append(await self.run_tool_call(body))
            rounds += 1
        info = self.reply_info(response, client_info)
        info.update(tool_calls=calls_log, tool_traces=tool_traces)
        return self.parse_reply(response), info

    async def on_tool_budget_exhausted(
        self, *, sampling: SamplingConfig | None, timeout_s: float | None
    ) -> tuple[ChatResponse, dict[str, Any]] | None:
        """Hook when the last allowed reply still calls tools; None keeps that reply as final."""
        return None

    async def run_tool_call(self, body: str) -> dict[str, Any]:
        """Run one call; its result (or what went wrong) is recorded as a tool message."""
        name, args, output, error = None, None, "", True
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            output = f"Error: invalid JSON in tool call ({exc.msg}). Expected {CALL_FORMAT}"
        else:
            name = call.get("name") if isinstance(call, dict) else None
            args = call.get("arguments", {}) if isinstance(call, dict) else None
            if name not in self.tools:
                output = f"Error: unknown tool {name!r}. Available tools: {sorted(self.tools)}"
            elif not isinstance(args, dict):
                output = f"Error: 'arguments' must be a JSON object, got {args!r}. Expected {CALL_FORMAT}"
            else:
                output, error = await self._invoke(name, args)
        self.ctx.append_message({"role": "tool", "name": str(name), "content": output})
        return {"name": name, "arguments": args, "output": output, "error": error}

    async def _invoke(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        try:
            result = self.tools[name](**args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the model sees the failure and may retry; not silent
            return f"Error: tool {name!r} raised {type(exc).__name__}: {exc}", True
        return (result if isinstance(result, str) else json.dumps(result, default=str)), False
