"""An Agent that can call Python functions as tools before answering.

Tools are described by JSON schema (``ludic.agents.tools.Tool``, built from typed callables)
and passed to the chat template as ``tools=`` and to the server as ``"tools"``. When the
tokenizer's chat template does not render ``tools`` (or there is no tokenizer), the tools and
the Hermes/Qwen call format are also described in the system message that is sent:

    <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>

Calls are read from the server's structured ``tool_calls`` when it returns them, else parsed
from the reply text (``ludic.agents.tool_calls``). A reply with calls is not an action: it is
kept in the context as an assistant message with ``tool_calls`` (and, where the chat template does
not render ``tool_calls``, as SmolLM2's does not, with the reply's whole text as its content, so the
model sees its own call and the ids it sampled stay the prompt's), the calls run (in order, or
concurrently when every tool called says it may), each result becomes a ``{"role": "tool",
"tool_call_id", "name", "content"}`` message, and the model is asked again. A missing tool, a tool
that raises or a result that cannot be written as JSON becomes a tool message saying what went wrong
and the loop goes on. A call that cannot be read (invalid JSON, no name, arguments that are not an
object) is no call: it is left out of the assistant message's ``tool_calls`` (its text stays in the
content) and answered by one user message saying what was wrong, so every tool message answers a
listed call, as OpenAI-compatible APIs and strict chat templates require. Synchronous tools run in a worker thread
(``ludic.agents.tool_runner``), so the event loop stays free and episode timeouts fire on time. Every model call of the turn is trainable: the tool-call
replies' traces go to ``info["tool_traces"]`` and from there to ``Step.tool_traces``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ludic.agents.base_agent import Agent
from ludic.agents.tool_calls import CALL_FORMAT, ToolCall, parse_text_tool_calls, structured_tool_calls
from ludic.agents.tool_runner import run_tool
from ludic.agents.tools import Tool, as_tools
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import ParseResult
from ludic.types import ChatResponse, Message, TokenTrace

ToolsArg = Sequence[Callable[..., Any] | Tool] | Mapping[str, Callable[..., Any] | Tool]


def describe_tool(tool: Tool) -> str:
    """One line: ``name(signature): description``."""
    return f"- {tool.name}{inspect.signature(tool.fn)}: {tool.description}".rstrip(": ")


def unreadable_calls_message(errors: list[str]) -> str:
    """What the model is told about tool calls that could not be read (each ``errors`` entry "Error: ...")."""
    if len(errors) == 1:
        return f"Your tool call could not be read, so it did not run. {errors[0]}"
    lines = "\n".join(f"- {e}" for e in errors)
    return f"{len(errors)} of your tool calls could not be read, so they did not run:\n{lines}"


class ToolAgent(Agent):
    """Agent + tools. ``tools``: callables / ``Tool``s (named by ``__name__``) or a name -> callable map.

    max_tool_rounds: how many tool-call replies one ``act`` may execute before the next reply is
        taken as final whatever it contains.
    tools_in_system_prompt: describe the tools in the sent system message; None (default) does so
        unless the tokenizer's chat template renders ``tools`` itself.
    ``act`` info adds ``tool_calls`` (id, name, arguments, output, error per call) and
    ``tool_traces`` (token traces of the tool-call replies; ``trace`` is the final reply's).
    """

    def __init__(
        self,
        *,
        tools: ToolsArg,
        max_tool_rounds: int = 1,
        tools_in_system_prompt: bool | None = None,
        **agent_kwargs: Any,
    ) -> None:
        super().__init__(**agent_kwargs)
        self.tools: dict[str, Tool] = as_tools(tools)
        if not isinstance(max_tool_rounds, int) or max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds must be an int >= 0, got {max_tool_rounds!r}")
        self.max_tool_rounds = max_tool_rounds
        if tools_in_system_prompt is None:
            template = getattr(self.tokenizer, "chat_template", None) or ""
            tools_in_system_prompt = "tools" not in template
        self.tools_in_system_prompt = tools_in_system_prompt
        # a template without ``tool_calls`` would render a call reply as its text minus the call: keep it all
        template = getattr(self.tokenizer, "chat_template", None)
        self.calls_in_content = isinstance(template, str) and "tool_calls" not in template
        self._calls_made = 0

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._calls_made = 0

    # --- prompt --------------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [t.schema for t in self.tools.values()]

    def tool_instructions(self) -> str:
        lines = "\n".join(describe_tool(t) for t in self.tools.values())
        return (
            f"You can call these tools:\n{lines}\nTo call a tool, reply with {CALL_FORMAT}. "
            "Tool results come back as tool messages. Reply without a tool call to answer."
        )

    def prepare_messages(self, messages: list[Message]) -> list[Message]:
        """Add the tool instructions to the system message of what is sent (not to the history)."""
        if not self.tools_in_system_prompt:
            return messages
        msgs = [dict(m) for m in messages]
        if msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = f"{msgs[0]['content']}\n\n{self.tool_instructions()}"
        else:
            msgs.insert(0, {"role": "system", "content": self.tool_instructions()})
        return msgs  # type: ignore[return-value]

    # --- acting --------------------------------------------------------------------------
    async def act(
        self, *, sampling: SamplingConfig | None = None, timeout_s: float | None = None
    ) -> tuple[ParseResult, dict[str, Any]]:
        calls_log: list[dict[str, Any]] = []
        tool_traces: list[TokenTrace | None] = []
        rounds = 0
        while True:
            response, client_info = await self.complete_once(sampling=sampling, timeout_s=timeout_s)
            content, calls = self.read_tool_calls(response)
            if not calls or response.finish_reason == "length" or rounds >= self.max_tool_rounds:
                self.ctx.on_after_act(response)
                if calls and response.finish_reason != "length":
                    final = await self.on_tool_budget_exhausted(sampling=sampling, timeout_s=timeout_s)
                    if final is not None:
                        tool_traces.append(response.to_trace())
                        response, client_info = final
                break
            self.ctx.append_message(self._call_message(response, content, calls))
            tool_traces.append(response.to_trace())
            calls_log.extend(await self.run_tool_calls(calls))
            rounds += 1
        info = self.reply_info(response, client_info)
        info.update(tool_calls=calls_log, tool_traces=tool_traces)
        return self.parse_reply(response), info

    def _call_message(self, response: ChatResponse, content: str, calls: list[ToolCall]) -> Message:
        """The assistant message of a reply with calls: ``tool_calls`` lists the readable ones (none: no key)."""
        text = response.text if self.calls_in_content and not response.tool_calls else content
        message: dict[str, Any] = {"role": "assistant", "content": text}
        readable = [c.as_message_entry() for c in calls if c.error is None]
        if readable:
            message["tool_calls"] = readable
        return message  # type: ignore[return-value]

    def read_tool_calls(self, response: ChatResponse) -> tuple[str, list[ToolCall]]:
        """(content, calls): the server's structured calls if any, else those in the text."""
        if response.tool_calls:
            calls = structured_tool_calls(response.tool_calls, first_id=self._calls_made)
            content = response.text
        else:
            content, calls = parse_text_tool_calls(response.text, first_id=self._calls_made)
        self._calls_made += len(calls)
        return content, calls

    async def on_tool_budget_exhausted(
        self, *, sampling: SamplingConfig | None, timeout_s: float | None
    ) -> tuple[ChatResponse, dict[str, Any]] | None:
        """Hook when the last allowed reply still calls tools; None keeps that reply as final."""
        return None

    async def run_tool_calls(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        """Run one reply's calls (concurrently when every tool called allows it), recording each
        result as a tool message in call order; the calls that could not be read get one user message
        after them (see the module docstring)."""
        parallel = len(calls) > 1 and all(
            c.error is None and c.name in self.tools and self.tools[c.name].concurrent for c in calls
        )
        if parallel:
            outputs = await asyncio.gather(*(self._run_one(c) for c in calls))
        else:
            outputs = [await self._run_one(c) for c in calls]
        log, unreadable = [], []
        for call, (output, error) in zip(calls, outputs, strict=True):
            if call.error is None:
                self.ctx.append_message(
                    {"role": "tool", "tool_call_id": call.id, "name": call.name or "unknown", "content": output}
                )
            else:
                unreadable.append(output)
            log.append(
                {"id": call.id, "name": call.name, "arguments": call.arguments, "output": output, "error": error}
            )
        if unreadable:
            self.ctx.append_message({"role": "user", "content": unreadable_calls_message(unreadable)})
        return log

    async def _run_one(self, call: ToolCall) -> tuple[str, bool]:
        if call.error is not None:
            return f"Error: {call.error}", True
        tool = self.tools.get(call.name or "")
        if tool is None:
            return f"Error: unknown tool {call.name!r}. Available tools: {sorted(self.tools)}", True
        return await run_tool(tool, call.arguments or {})
