"""Publish each step's weights to several inference servers at once, each within a time bound.

A multi-host run (``[cluster].servers``) has one trainer and N servers; every server must get every
version. ``FanoutPublisher`` runs one inner publisher per server (a ``ClientPublisher`` on that server's
``VLLMChatClient``, built by the caller) on its own thread, all at the same time, and waits for each at most
``timeout_s`` from the start of the publish. A server that fails or does not answer in time is named in the
error with the operation and the seconds waited; what happens then is ``on_failure``:

- ``"skip"`` (default): the run goes on. That server keeps serving its last complete version (Ludic's
  server reads the whole blob before it applies any of it, so a cut upload changes nothing and its
  ``policy_version`` stays the old one); the next publish sends the full weights again, so the first one
  that reaches it brings it up to date. Every server failing the same publish still raises: no server got
  the version.
- ``"stop"``: any failed server raises ``FanoutPublishError`` and the step (so the run) stops.

A server whose previous upload is still running (a thread past its bound cannot be killed; it ends when the
client's own socket timeout fires) is not sent a second one: that publish counts as failed for it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from ludic.distributed.interfaces import PolicyPublisher
from ludic.distributed.publisher import declare_restore

FAILURE_POLICIES = ("skip", "stop")
DEFAULT_PUBLISH_TIMEOUT_S = 600.0
"""Default bound on one server's publish, as ``[timeouts].publish_s`` (``ludic train`` passes that table's value)."""
OPERATION = "publish weights (POST /ludic/update_weights_blob)"


class FanoutPublishError(RuntimeError):
    """A publish did not reach one or more servers; each line names the server, the operation and the wait."""

    def __init__(self, failures: list[ServerFailure], *, version: int | None, of: int) -> None:
        self.failures = failures
        lines = "\n  ".join(f.describe() for f in failures)
        super().__init__(
            f"weights version {version} reached {of - len(failures)} of {of} servers:\n  {lines}"
        )


@dataclass(frozen=True)
class ServerFailure:
    """One server's failed publish."""

    url: str
    version: int | None
    waited_s: float
    error: str

    def describe(self) -> str:
        return f"{self.url}: {OPERATION} of version {self.version} failed after {self.waited_s:.1f} s: {self.error}"


class FanoutPublisher:
    """PolicyPublisher sending each publish to every server of ``targets`` (``{url: inner publisher}``).

    timeout_s: how long one publish waits for each server (all run at once, so also the whole publish's
    bound, plus a little); on_failure: ``"skip"`` or ``"stop"`` (module docstring).
    ``failures``: every failed server publish so far; ``last_stats`` counts this publish's outcomes.
    """

    def __init__(
        self,
        targets: Mapping[str, PolicyPublisher],
        *,
        timeout_s: float = DEFAULT_PUBLISH_TIMEOUT_S,
        on_failure: Literal["skip", "stop"] = "skip",
        lora: str = "merged",
    ) -> None:
        if not targets:
            raise ValueError("FanoutPublisher needs at least one server")
        if on_failure not in FAILURE_POLICIES:
            raise ValueError(f"on_failure must be one of {FAILURE_POLICIES}, got {on_failure!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        for url, inner in targets.items():
            if not callable(getattr(inner, "publish", None)):
                raise TypeError(f"the publisher for {url} has no publish(state_dict, version=) method")
        self.targets = dict(targets)
        self.timeout_s = float(timeout_s)
        self.on_failure = on_failure
        self.lora_publish = lora
        self.failures: list[ServerFailure] = []
        self.last_stats: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=len(self.targets), thread_name_prefix="ludic-fanout")
        self._running: dict[str, Future] = {}
        self._lock = threading.Lock()

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        start = time.monotonic()
        futures: dict[str, Future] = {}
        failed: list[ServerFailure] = []
        for url, inner in self.targets.items():
            previous = self._running.get(url)
            if previous is not None and not previous.done():
                failed.append(ServerFailure(url, version, 0.0, "its previous upload is still running"))
                continue
            futures[url] = self._running[url] = self._pool.submit(inner.publish, state_dict, version=version)
        deadline = start + self.timeout_s
        for url, future in futures.items():
            try:
                future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                waited = time.monotonic() - start
                failed.append(
                    ServerFailure(url, version, waited, f"no answer within the {self.timeout_s:g} s bound")
                )
            except Exception as exc:  # the server's refusal, a reset connection, a socket timeout
                failed.append(
                    ServerFailure(url, version, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
                )
        self._record(failed, version, time.monotonic() - start)

    def declare_restore(self, version: int) -> bool:
        """Each server's ``declare_restore`` (the next publish may go back to ``version``), all at once within
        ``timeout_s``; a server that fails it is warned about (that publish then fails there, as the policy says)."""
        futures = {
            url: self._pool.submit(declare_restore, inner, version) for url, inner in self.targets.items()
        }
        deadline, declared = time.monotonic() + self.timeout_s, False
        for url, future in futures.items():
            try:
                declared = bool(future.result(timeout=max(deadline - time.monotonic(), 0.0))) or declared
            except Exception as exc:  # FutureTimeout included
                print(f"[ludic] warning: {url}: declaring the restore of version {version} failed: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)  # fmt: skip
        return declared

    def _record(self, failed: list[ServerFailure], version: int | None, seconds: float) -> None:
        with self._lock:
            self.failures.extend(failed)
        n = len(self.targets)
        stats = {"publish_servers_ok": float(n - len(failed)), "publish_servers_failed": float(len(failed))}
        self.last_stats = {**self._inner_stats(), **stats, "publish_fanout_seconds": seconds}
        if not failed:
            return
        error = FanoutPublishError(failed, version=version, of=n)
        if self.on_failure == "stop" or len(failed) == n:
            raise error
        print(f"[ludic] warning: {error} (publish_failure = 'skip': those servers keep their last complete "
              "version until a later publish reaches them)", file=sys.stderr, flush=True)  # fmt: skip

    def _inner_stats(self) -> dict[str, float]:
        first = next(iter(self.targets.values()))
        return {k: float(v) for k, v in (getattr(first, "last_stats", None) or {}).items()}

    def in_flight(self) -> list[str]:
        """The servers whose upload (from a publish that gave up on them) is still running."""
        return [url for url, future in self._running.items() if not future.done()]

    def close(self) -> None:
        """Stop the worker threads (waits for none still uploading)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
