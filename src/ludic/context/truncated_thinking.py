"""Memory that keeps every turn but hides old reasoning from the prompt.

Long ``<think>`` blocks from earlier turns dominate the prompt of multi-turn episodes
while adding little; dropping them from the prompt (not from the record) keeps prompts
short. The full text stays in ``ctx.messages`` for logging.
"""

from __future__ import annotations

import re

from ludic.context.base import ContextStrategy, copy_messages
from ludic.parsers import THINK_TAG
from ludic.types import Message

_SPACE = re.compile(r"\s*")


def strip_thinking(text: str, placeholder: str = "") -> str:
    """Replace every ``<think>...</think>`` block (and the whitespace after it) with ``placeholder``.

    Tag names match case-insensitively (``<Think>``, ``<THINK>``), as in ``think_prefix_parser``. Each
    opening pairs with the first closing after it, as the regex ``<think>.*?</think>\\s*`` (IGNORECASE)
    would, but in one pass over the tags: the regex rescanned to the end from every unclosed ``<think>``
    (quadratic), and read ``placeholder`` as a template (``\\1`` raised, ``\\g<0>`` kept the block).
    """
    kept: list[str] = []
    done, opened = 0, -1
    for tag in THINK_TAG.finditer(text):
        if not tag.group(1):
            if opened < 0:
                opened = tag.start()
        elif opened >= 0:
            kept += [text[done:opened], placeholder]
            done, opened = _SPACE.match(text, tag.end()).end(), -1  # type: ignore[union-attr]
    return "".join(kept) + text[done:]


class TruncatedThinkingContext(ContextStrategy):
    """Full history; the prompt shows earlier assistant turns with their thinking removed.

    placeholder: text that stands in for a removed block (default: nothing).
    """

    def __init__(self, system_prompt: str | None = None, *, placeholder: str = "") -> None:
        self.placeholder = placeholder
        super().__init__(system_prompt)

    def on_before_act(self) -> list[Message]:
        prompt = copy_messages(self._messages)
        for msg in prompt:
            if msg.get("role") == "assistant" and isinstance(msg.get("content"), str):
                msg["content"] = strip_thinking(msg["content"], self.placeholder)
        return prompt
