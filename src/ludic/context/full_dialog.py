"""The simplest memory: send the whole recorded dialog every time."""

from __future__ import annotations

from ludic.context.base import ContextStrategy, copy_messages
from ludic.types import Message


class FullDialog(ContextStrategy):
    """Keeps and sends the entire history (system prompt, observations, replies, tool results)."""

    def on_before_act(self) -> list[Message]:
        return copy_messages(self._messages)
