"""The episode a model call belongs to, for clients that keep an episode on one server.

The rollout engine runs each episode attempt inside ``episode_scope(key)``; a client spreading calls over
several servers (``ludic.inference.multi_server``) reads ``current_episode_key()`` and sends every turn of
one episode to the same server (its KV cache and weight version stay the same across turns). A context
variable rather than a request field: agents, protocols and agent programs need not pass it on, and each
asyncio task of ``gather`` sees its own episode's key.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_EPISODE_KEY: ContextVar[str | None] = ContextVar("ludic_episode_key", default=None)


def current_episode_key() -> str | None:
    """The key of the episode whose code is running now (None outside any episode)."""
    return _EPISODE_KEY.get()


@contextlib.contextmanager
def episode_scope(key: str) -> Iterator[str]:
    """Mark the calls made inside the block (and tasks started there) as one episode's."""
    if not key:
        raise ValueError("episode key must be a non-empty string")
    token = _EPISODE_KEY.set(key)
    try:
        yield key
    finally:
        _EPISODE_KEY.reset(token)
