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
        if not isinstance(self.answer, str) or not self.answer:
            raise ValueError(f"Demonstration.answer must be a non-empty string, got {self.answer!r}")
        if isinstance(self.prompt, str):
            if not self.prompt:
                raise ValueError("Demonstration.prompt is an empty string")
        elif not self.prompt or not all(isinstance(m, dict) and "role" in m for m in self.prompt):
            raise ValueError(
                "Demonstration.prompt must be a string or a non-empty list of {role, content} messages"
            )
        if self.tools is not None and (
            isinstance(self.tools, (str, Mapping)) or not all(isinstance(t, Mapping) for t in self.tools)
        ):
            raise ValueError(f"Demonstration.tools must be a list of tool schemas (JSON objects), got {self.tools!r:.80}")


@runtime_checkable
class ProvidesDemonstrations(Protocol):
    """An env that can show ``n`` correct answers to its own training prompts, chosen by ``seed``."""

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]: ...
