"""Demonstrations an env can provide for an SFT warm start (``[sft] from_env = true`` in a run config).

An env kind that knows correct answers (a data set's training rows) implements
:class:`ProvidesDemonstrations`; ``ludic train`` turns each :class:`Demonstration` into an SFT item,
tokenised as the agent will see the prompt. Only training prompts are ever demonstrated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ludic.types import Message


@dataclass(frozen=True)
class Demonstration:
    """One correct answer: ``prompt`` (the user message's text, or the whole message list) -> ``answer``.

    ``tools``: the tool schemas the agent passes (OpenAI ``tools=``), rendered into the prompt by the chat
    template as at rollout time; a tool-calling answer is written in the template's own format (e.g.
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), as the model would sample it.
    """

    prompt: str | Sequence[Message]
    answer: str
    tools: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        _check_answer(self.answer)
        _check_prompt(self.prompt)
        _check_tools(self.tools)


def _check_text(field: str, value: str) -> None:
    """A lone surrogate (JSON ``"\\ud800"``) reads fine but cannot be tokenised: refuse it here, by field."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"Demonstration.{field} is not valid Unicode text ({exc.reason} at character {exc.start})") from exc


def _check_answer(answer: object) -> None:
    """A blank answer would teach the model to say nothing (or only whitespace) and stop."""
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"Demonstration.answer must be a non-empty string, got {answer!r:.80}")
    _check_text("answer", answer)


def _check_prompt(prompt: object) -> None:
    """A string, or messages whose role and content the chat template can render (else a TypeError later)."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("Demonstration.prompt is an empty string")
        _check_text("prompt", prompt)
        return
    if isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence) or not prompt:
        raise ValueError(
            "Demonstration.prompt must be a string or a non-empty list of {role, content} messages, "
            f"got {prompt!r:.80}"
        )
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not m["role"]:
            raise ValueError(f"Demonstration.prompt[{i}] must be a {{role, content}} message with a string role, got {m!r:.80}")
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"Demonstration.prompt[{i}].content must be a string, got {content!r:.80}")
        if content is not None:
            _check_text(f"prompt[{i}].content", content)


def _check_tools(tools: object) -> None:
    if tools is not None and (
        isinstance(tools, (str, bytes, Mapping))
        or not isinstance(tools, Sequence)
        or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise ValueError(f"Demonstration.tools must be a list of tool schemas (JSON objects), got {tools!r:.80}")


@runtime_checkable
class ProvidesDemonstrations(Protocol):
    """An env that can show ``n`` correct answers to its own training prompts, chosen by ``seed``."""

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]: ...
