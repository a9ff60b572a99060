"""Announce the trainer's policy version on the run's stream keys, after the weights have gone out.

Actors read it for admission control (hold back rather than generate samples the trainer would drop
as stale) and ``PipelineBatchSource`` reads it as the trainer's version by default.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ludic.distributed.interfaces import PolicyPublisher
from ludic.timeouts import Timeouts, WaitTimeout
from ludic.training.pipeline.redis_server import REDIS_EXTRA_HINT


class PipelineVersionPublisher:
    """Wraps the real publisher: ``inner.publish(...)`` first, then SET the run's version key.

    ``inner=None`` when actors get weights some other way (or share the trainer's engine) and only
    the version needs announcing. Weights first, then the version: an actor that sees version v can
    already sample from v.
    """

    def __init__(
        self, inner: PolicyPublisher | None, *, redis_url: str, run_id: str,
        call_timeout_s: float = Timeouts.redis_s, reconnect_timeout_s: float = Timeouts.redis_reconnect_s,
    ) -> None:  # fmt: skip
        try:
            import redis
        except ImportError as exc:
            raise ImportError(f"pipeline RL needs the redis client; {REDIS_EXTRA_HINT}") from exc
        from ludic.training.pipeline.stream import PipelineStream

        self.inner = inner
        stream = PipelineStream(redis_url, run_id)
        self.version_key, self._peer = stream.version_key, f"Redis at {stream._safe_url()}"
        self.call_timeout_s, self.reconnect_timeout_s = call_timeout_s, reconnect_timeout_s
        self._redis: Any = redis.Redis.from_url(redis_url, socket_connect_timeout=2.0, socket_timeout=call_timeout_s)
        self._errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        if self.inner is not None:
            self.inner.publish(state_dict, version=version)
        if version is not None:
            self.announce(int(version))

    def declare_restore(self, version: int) -> bool:
        """The inner publisher's (the next publish may go back to ``version``); the version key follows at that
        publish, SET like any other."""
        from ludic.distributed.publisher import declare_restore

        return declare_restore(self.inner, version)

    @property
    def last_stats(self) -> dict[str, float]:
        """The inner publisher's (bytes sent, servers reached): the Trainer logs them under ``perf/``."""
        return dict(getattr(self.inner, "last_stats", None) or {})

    def announce(self, version: int) -> None:
        """SET the version key, retrying through a Redis restart for ``reconnect_timeout_s``; each try waits
        ``call_timeout_s`` for the reply. A Redis that accepts and never answers: ``WaitTimeout`` naming it."""
        import redis

        started = time.monotonic()
        while True:
            try:
                self._redis.set(self.version_key, version)
                return
            except self._errors as exc:
                waited = time.monotonic() - started
                if waited < self.reconnect_timeout_s:
                    time.sleep(min(0.5, self.reconnect_timeout_s - waited))
                    continue
                if isinstance(exc, redis.TimeoutError):
                    raise WaitTimeout(
                        peer=self._peer, operation=f"SET {self.version_key} (announcing version {version})",
                        waited_s=waited, bound_s=self.reconnect_timeout_s + self.call_timeout_s,
                        detail=f"each try waited {self.call_timeout_s:g} s for a reply",
                    ) from exc  # fmt: skip
                raise
