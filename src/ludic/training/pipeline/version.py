"""Announce the trainer's policy version on the run's stream keys, after the weights have gone out.

Actors read it for admission control (hold back rather than generate samples the trainer would drop
as stale) and ``PipelineBatchSource`` reads it as the trainer's version by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ludic.distributed.interfaces import PolicyPublisher
from ludic.training.pipeline.redis_server import REDIS_EXTRA_HINT


class PipelineVersionPublisher:
    """Wraps the real publisher: ``inner.publish(...)`` first, then SET the run's version key.

    ``inner=None`` when actors get weights some other way (or share the trainer's engine) and only
    the version needs announcing. Weights first, then the version: an actor that sees version v can
    already sample from v.
    """

    def __init__(self, inner: PolicyPublisher | None, *, redis_url: str, run_id: str) -> None:
        try:
            import redis
        except ImportError as exc:
            raise ImportError(f"pipeline RL needs the redis client; {REDIS_EXTRA_HINT}") from exc
        from ludic.training.pipeline.stream import PipelineStream

        self.inner = inner
        self.version_key = PipelineStream(redis_url, run_id).version_key
        self._redis: Any = redis.Redis.from_url(redis_url, socket_connect_timeout=2.0)
        self._errors = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        if self.inner is not None:
            self.inner.publish(state_dict, version=version)
        if version is not None:
            self.announce(int(version))

    def announce(self, version: int, *, retries: int = 50) -> None:
        """SET the version key, retrying through a Redis restart (about 25 s in all)."""
        import time

        for attempt in range(retries):
            try:
                self._redis.set(self.version_key, version)
                return
            except self._errors:
                if attempt == retries - 1:
                    raise
                time.sleep(0.5)
