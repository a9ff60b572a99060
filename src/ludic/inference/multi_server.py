"""``MultiServerClient``: one ChatClient over several inference servers (``[cluster].servers``).

Spreading: a call goes to the server with the fewest requests in flight (ties in turn, so sequential
calls alternate). Affinity: every call of one episode (``ludic.inference.episode_key``, set by the rollout
engine per attempt) goes to the server its first call went to, so a multi-turn episode is sampled by one
server's weights and cache.

Failure: a server that cannot be reached, drops the connection or times out (a transport error left after
the inner client's own retries) is marked down for ``cooloff_s`` seconds, and the failing call raises
``ServerDownError`` naming it. The episode is then not continued on another server: the rollout engine
retries it from its start (``RolloutEngine(episode_retries=...)``), on a server that is up, or counts it
failed; a half-played episode is never trained. After the cool-off the server is tried again. A 4xx (a
refused request) or a 5xx (the server answered, and failed) propagates unchanged and marks nothing down.

``get_policy_version`` is the minimum over the servers that answer, so the actor's staleness is never
under-counted; ``sync_weights`` uploads to every server in turn and names the one that failed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import torch

from ludic.inference.episode_key import current_episode_key
from ludic.inference.http_client import ServerError
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.vllm.client import VLLMChatClient
from ludic.types import ChatResponse

log = logging.getLogger(__name__)
MAX_AFFINITIES = 65_536
"""Episodes whose server is remembered (least recently used forgotten first)."""


class ServerDownError(ServerError):
    """A server could not be reached or stopped answering; ``server`` is its base URL. The episode that
    made the call should be replayed from its start elsewhere (the rollout engine does, within its bound)."""

    def __init__(self, message: str, server: str) -> None:
        super().__init__(message)
        self.server = server


def server_went_down(exc: BaseException | None) -> bool:
    """``ServerDownError`` anywhere in ``exc``'s chain (a protocol may wrap what the client raised): the
    episode is worth replaying on another server."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ServerDownError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _server_down(exc: BaseException) -> bool:
    """A transport failure (refused, reset, timed out), not a server that answered with an error."""
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, ServerError) and exc.status is None)


class MultiServerClient:
    """ChatClient (and VersionedClient) over ``servers`` (base URLs), each through a ``VLLMChatClient``.

    api_key: the servers' bearer token; cooloff_s: how long a failed server is left out; retries /
    backoff_s / timeout_s / route: each inner client's (few retries: another server is the better retry).
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        api_key: str | None = None,
        cooloff_s: float = 30.0,
        retries: int = 1,
        backoff_s: float = 0.2,
        timeout_s: float = 600.0,
        route: str = "completions",
        enable_weight_updates: bool = False,
    ) -> None:
        if not servers:
            raise ValueError("MultiServerClient needs at least one server URL")
        if len(set(servers)) != len(servers):
            raise ValueError(f"servers names one server twice: {list(servers)}")
        if cooloff_s < 0:
            raise ValueError(f"cooloff_s must be >= 0, got {cooloff_s}")
        self.clients = [
            VLLMChatClient(base_url=url, api_key=api_key or "", retries=retries, backoff_s=backoff_s,
                           timeout_s=timeout_s, route=route, enable_weight_updates=enable_weight_updates)
            for url in servers
        ]  # fmt: skip
        self.urls = [c.base_url for c in self.clients]
        self.cooloff_s = cooloff_s
        self.in_flight = [0] * len(servers)
        """Requests each server is working on now."""
        self.served = [0] * len(servers)
        """Completions each server returned."""
        self.down_until = [0.0] * len(servers)
        """``time.monotonic()`` until which each server is left out (0: up)."""
        self._turn = itertools.count()
        self._affinity: OrderedDict[str, int] = OrderedDict()

    # ---- choosing a server ------------------------------------------------------------------
    def is_up(self, i: int) -> bool:
        return time.monotonic() >= self.down_until[i]

    def server_for(self, key: str | None) -> int:
        """The server of episode ``key`` (its first call picks one); raises if that server went down."""
        if key is not None and key in self._affinity:
            i = self._affinity[key]
            self._affinity.move_to_end(key)
            if not self.is_up(i):
                raise ServerDownError(f"server {self.urls[i]} is down (episode {key} began there)", self.urls[i])
            return i
        i = self._least_busy()
        if key is not None:
            self._affinity[key] = i
            while len(self._affinity) > MAX_AFFINITIES:
                self._affinity.popitem(last=False)
        return i

    def _least_busy(self) -> int:
        up = [i for i in range(len(self.urls)) if self.is_up(i)]
        if not up:
            waits = ", ".join(f"{u} ({self.down_until[i] - time.monotonic():.1f} s)" for i, u in enumerate(self.urls))
            raise ServerDownError(f"all {len(self.urls)} servers are down; cool-off left: {waits}", self.urls[0])
        start = next(self._turn) % len(self.urls)  # ties go round: sequential calls alternate
        return min(up, key=lambda i: (self.in_flight[i], (i - start) % len(self.urls)))

    def mark_down(self, i: int) -> None:
        self.down_until[i] = time.monotonic() + self.cooloff_s
        for key in [k for k, s in self._affinity.items() if s == i]:
            del self._affinity[key]

    def _down_error(self, i: int, what: str, exc: BaseException) -> ServerDownError:
        self.mark_down(i)
        error = ServerDownError(
            f"server {self.urls[i]} failed during {what} and is left out for {self.cooloff_s:g} s: "
            f"{type(exc).__name__}: {exc}", self.urls[i],
        )  # fmt: skip
        log.warning("%s", error)  # once per failure: an operator sees which server went and when
        return error

    # ---- ChatClient -------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        i = self.server_for(current_episode_key())
        self.in_flight[i] += 1
        try:
            response, info = await self.clients[i].complete(request)
        except Exception as exc:
            if _server_down(exc):
                raise self._down_error(i, "a completion", exc) from exc
            raise
        finally:
            self.in_flight[i] -= 1
        self.served[i] += 1
        return response, {**info, "server": self.urls[i]}

    async def get_policy_version(self) -> int:
        """The oldest weight version among the servers that answer (a failing one is marked down)."""
        up = [i for i in range(len(self.urls)) if self.is_up(i)]
        replies = await asyncio.gather(*(self.clients[i].get_policy_version() for i in up), return_exceptions=True)
        versions = []
        for i, reply in zip(up, replies, strict=True):
            if isinstance(reply, BaseException):
                if not _server_down(reply):
                    raise reply
                self._down_error(i, "GET /policy_version", reply)
            else:
                versions.append(int(reply))
        if not versions:
            raise ServerDownError(f"no server answered GET /policy_version ({', '.join(self.urls)})", self.urls[0])
        return min(versions)

    def sync_weights(
        self, params: Mapping[str, torch.Tensor], *, timeout_s: float = 600.0, version: int | None = None
    ) -> str:
        """Upload to every server in turn; the first failure raises naming its server."""
        statuses = []
        for client in self.clients:
            try:
                statuses.append(client.sync_weights(params, timeout_s=timeout_s, version=version))
            except Exception as exc:
                raise ServerError(f"weight upload to {client.base_url} failed: {type(exc).__name__}: {exc}") from exc
        return "; ".join(f"{u}: {s}" for u, s in zip(self.urls, statuses, strict=True))

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
