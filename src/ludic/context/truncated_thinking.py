"""Memory that keeps every turn but hides old reasoning from the prompt.

Long ``<think>`` blocks from earlier turns dominate the prompt of multi-turn episodes
while adding little; dropping them from the prompt (not from the record) keeps prompts
short. The full text stays in ``ctx.messages`` for logging.
"""

from __future__ import annotations

import re

from ludic.context.base import ContextStrategy
from ludic.types import Message

_OPEN, _CLOSE = "<think>", "</think>"
_SPACE = re.compile(r"\s*")


def strip_thinking(text: str, placeholder: str = "") -> str:
    """Replace every ``<think>...</think>`` block (and the whitespace after it) with ``placeholder``.

    Each opening pairs with the first closing after it, as the regex ``<think>.*?</think>\\s*`` would,
    but in one pass with ``str.find``: the regex rescanned to the end from every unclosed ``<think>``
    (quadratic), and read ``placeholder`` as a template (``\\1`` raised, ``\\g<0>`` kept the block).
    """
    kept: list[str] = []
    done = 0
    while (start := text.find(_OPEN, done)) >= 0 and (end := text.find(_CLOSE, start + len(_OPEN))) >= 0:
        kept += [text[done:start], placeholder]
        done = _SPACE.match(text, end + len(_CLOSE)).end()  # type: ignore[union-attr]
    return "".join(kept) + text[done:]


class TruncatedThinkingContext(ContextStrategy):
    """Full history; the prompt shows earlier assistant turns with their thinking removed.

    placeholder: text that stands in for a removed block (default: nothing).
    """

    def __init__(self, system_prompt: str | None = None, *, placeholder: str = "") -> None:
        self.placeholder = placeholder
        super().__init__(system_prompt)

    def on_before_act(self) -> list[Message]:
        prompt: list[Message] = []
        for msg in self._messages:
            msg = dict(msg)  # type: ignore[assignment]
            if msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
                msg["content"] = strip_thinking(msg["content"], self.placeholder)
            prompt.append(msg)
        return prompt
