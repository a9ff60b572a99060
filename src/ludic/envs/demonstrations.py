"""Demonstrations an env can provide for an SFT warm start (``[sft] from_env = true`` in a run config).

An env kind that knows correct answers (a data set's training rows) implements
:class:`ProvidesDemonstrations`; ``ludic train`` turns each :class:`Demonstration` into an SFT item,
tokenised as the agent will see the prompt. Only training prompts are ever demonstrated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ludic.types import Message


@dataclass(frozen=True)
class Demonstration:
    """One correct answer: ``prompt`` (the user message's text, or the whole message list) -> ``answer``."""

    prompt: str | Sequence[Message]
    answer: str

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


@runtime_checkable
class ProvidesDemonstrations(Protocol):
    """An env that can show ``n`` correct answers to its own training prompts, chosen by ``seed``."""

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]: ...
