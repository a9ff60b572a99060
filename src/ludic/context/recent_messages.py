"""A bounded memory: the system prompt plus the last few messages.

For envs whose observation already holds the whole state (a board game's board), the history adds
nothing the model needs, while its length grows every turn: prompts, prefill and training all pay
for it. ``RecentMessages(keep=1)`` sends only the latest observation (or the parser's note after a
rejected reply), so every turn costs the same.
"""

from __future__ import annotations

from ludic.context.base import ContextStrategy, copy_messages
from ludic.types import Message


class RecentMessages(ContextStrategy):
    """Sends the system prompt (if any) and the last ``keep`` messages; the full history is kept.

    A tool exchange is never split: when the window would start with a ``tool`` message, it widens back
    to the message before the tool results (the assistant message whose ``tool_calls`` they answer), so
    ``keep=1`` after a tool round sends that assistant message and all its results. A ``tool`` message
    with no tool call before it is refused by OpenAI-compatible APIs and by chat templates.
    """

    def __init__(self, keep: int = 1, system_prompt: str | None = None) -> None:
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"RecentMessages.keep must be an int >= 1, got {keep!r}")
        self.keep = keep
        super().__init__(system_prompt)

    def on_before_act(self) -> list[Message]:
        messages = self._messages
        head = 1 if messages and messages[0].get("role") == "system" else 0
        start = max(head, len(messages) - self.keep)
        while start > head and messages[start].get("role") == "tool":
            start -= 1
        return copy_messages(messages[:head] + messages[start:])
