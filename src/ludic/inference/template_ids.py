"""Chat-template token ids, memoised per exact message list.

A GRPO group sends the same prompt G times, each from a fresh agent; rendering the Jinja chat
template is most of an agent's own cost per step on a small model. The ids are a pure function of
(template, messages), so identical message lists reuse them. Templates that read the clock
(``strftime_now``, as some put today's date in the system prompt) are never cached.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from typing import Any

from ludic.types import Message

MAX_ENTRIES = 4096
"""Distinct message lists remembered per tokenizer (least recently used ones are dropped)."""

_CACHES: weakref.WeakKeyDictionary[Any, OrderedDict[str, tuple[int, ...]]] = weakref.WeakKeyDictionary()


def chat_template_ids(
    tokenizer: Any, messages: list[Message], *, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` as ids."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "strftime" in template:
        return _render(tokenizer, messages, tools)
    key = template + "\x00" + json.dumps([messages, tools], sort_keys=True, default=str)
    try:
        cache = _CACHES.setdefault(tokenizer, OrderedDict())
    except TypeError:  # not weak-referenceable: no cache
        return _render(tokenizer, messages, tools)
    ids = cache.get(key)
    if ids is None:
        ids = tuple(_render(tokenizer, messages, tools))
        cache[key] = ids
        if len(cache) > MAX_ENTRIES:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return list(ids)


def _render(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
    extra = {} if tools is None else {"tools": tools}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
    )
    return [int(t) for t in ids]
