"""How an agent turns its history into the messages it sends to the model."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

from ludic.types import ChatResponse, Info, Message, Obs


def copy_messages(messages: list[Message]) -> list[Message]:
    """Copies of ``messages`` that share no dict or list with them (``tool_calls`` nests both), so a caller
    that edits a prompt or ``ctx.messages`` (``msgs[-1]["content"] += ...``) never edits the history."""
    return copy.deepcopy(messages)


class ContextStrategy(ABC):
    """Memory and prompt management, driven by five hooks the agent calls in order."""

    def __init__(self, system_prompt: str | None = None) -> None:
        self._system_prompt = system_prompt
        self._messages: list[Message] = []
        self.reset(system_prompt)

    @property
    def messages(self) -> list[Message]:
        """The full recorded history (never trimmed), as copies: changing them never changes the history."""
        return copy_messages(self._messages)

    @property
    def system_prompt(self) -> str | None:
        """The system prompt the history starts with (None if there is none)."""
        return self._system_prompt

    def append_message(self, message: Message) -> None:
        """Record a copy of an extra message (e.g. a tool result) in the history."""
        self._messages.append(copy.deepcopy(message))

    def reset(self, system_prompt: str | None = None) -> None:
        """Clear the history, keeping (or replacing) the system prompt."""
        if system_prompt is not None:
            self._system_prompt = system_prompt
        self._messages = []
        if self._system_prompt:
            self._messages.append({"role": "system", "content": self._system_prompt})

    def on_env_reset(self, obs: Obs, info: Info) -> None:
        """Record the first observation as a user message."""
        self._messages.append({"role": "user", "content": str(obs)})

    @abstractmethod
    def on_before_act(self) -> list[Message]:
        """The messages to send to the model for the next action: copies (:func:`copy_messages`), never
        the recorded dicts, so the caller may edit them."""

    def on_after_act(self, response: ChatResponse) -> None:
        """Record the assistant's reply."""
        self._messages.append({"role": "assistant", "content": response.text})

    def on_after_step(self, obs: Obs | None, info: Info) -> None:
        """Record the next observation (skipped when the episode ended with no observation)."""
        if obs is not None:
            self._messages.append({"role": "user", "content": str(obs)})
