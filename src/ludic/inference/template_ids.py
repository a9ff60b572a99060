"""Chat-template token ids, memoised per exact message list.

A GRPO group sends the same prompt G times, each from a fresh agent; rendering the Jinja chat
template is most of an agent's own cost per step on a small model. The ids are a pure function of
(template, messages), so identical message lists reuse them. Templates that read the clock
(``strftime_now``, as some put today's date in the system prompt) are never cached. The cache is
bounded in entries and in bytes (a server renders chats its clients send).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ludic.types import Message

MAX_ENTRIES = 4096
"""Distinct message lists remembered per tokenizer (least recently used ones are dropped)."""
MAX_CACHED_BYTES = 64 << 20
"""About the memory the cache of one tokenizer may hold (keys, and ids at ``ID_BYTES`` each): the server
renders chats its clients send (``inference/server/_exact_ids.py``), so a count bound alone would let
megabyte chats pile up."""
ID_BYTES = 40
"""What one id costs in a tuple of Python ints (the pointer and, above 256, the int object)."""


@dataclass
class _Cache:
    entries: OrderedDict[str, tuple[int, ...]] = field(default_factory=OrderedDict)
    size: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # the server renders on worker threads


_CACHES: weakref.WeakKeyDictionary[Any, _Cache] = weakref.WeakKeyDictionary()


def chat_template_ids(
    tokenizer: Any, messages: list[Message], *, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` as ids."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "strftime" in template:
        return _render(tokenizer, messages, tools)
    key = template + "\x00" + json.dumps([messages, tools], sort_keys=True, default=str)
    try:
        cache = _CACHES.setdefault(tokenizer, _Cache())
    except TypeError:  # not weak-referenceable: no cache
        return _render(tokenizer, messages, tools)
    with cache.lock:
        ids = cache.entries.get(key)
        if ids is not None:
            cache.entries.move_to_end(key)
    if ids is None:
        ids = tuple(_render(tokenizer, messages, tools))
        with cache.lock:
            _remember(cache, key, ids)
    return list(ids)


def _remember(cache: _Cache, key: str, ids: tuple[int, ...]) -> None:
    """Keep ``ids``, dropping the least recently used entries past either bound (too large: not kept)."""
    size = len(key) + ID_BYTES * len(ids)
    if size > MAX_CACHED_BYTES or key in cache.entries:
        return
    cache.entries[key] = ids
    cache.size += size
    while cache.entries and (len(cache.entries) > MAX_ENTRIES or cache.size > MAX_CACHED_BYTES):
        old_key, old_ids = cache.entries.popitem(last=False)
        cache.size -= len(old_key) + ID_BYTES * len(old_ids)


def _render(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
    extra = {} if tools is None else {"tools": tools}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
    )
    return [int(t) for t in ids]
