"""Pausing generation around a weight update, with vLLM's three modes (``POST /pause?mode=...``).

vLLM's semantics (``AsyncLLM.pause_generation``, docs "Async Reinforcement Learning"): while paused,
new requests are held, neither refused nor scheduled, until ``/resume``. The mode says what happens
to the requests already in flight (queued in the engine or decoding):

- ``abort`` (vLLM's default): they end at once and return what they have, ``finish_reason="abort"``.
- ``wait``: ``/pause`` returns once they have finished; nothing new starts meanwhile.
- ``keep``: they freeze between two decoding steps and continue on ``/resume``; a weight update made
  meanwhile applies to the tokens after the freeze (``weight_versions`` then has a span per version).

``PauseGate`` is the embedded engine's state for this: an asyncio gate where new requests wait, and
a thread-safe freeze the decoding thread honours between steps, releasing the weights lock while it
waits so a weight update can load.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

PAUSE_MODES = ("abort", "wait", "keep")


class _Lock(Protocol):
    def acquire(self) -> bool: ...
    def release(self) -> None: ...


def check_mode(mode: object) -> str:
    if mode not in PAUSE_MODES:
        raise ValueError(f"unknown pause mode {mode!r}: mode must be one of {list(PAUSE_MODES)}")
    return str(mode)


class PauseGate:
    """Whether generation is paused, and how; the engine consults it at admission, scheduling and each step."""

    def __init__(self) -> None:
        self.mode: str | None = None  # None: running
        self._resumed: asyncio.Event | None = None  # made on pause, inside the engine's loop
        self._thaw = threading.Event()
        self._thaw.set()
        self._count_lock = threading.Lock()
        self._frozen = 0  # decoding batches waiting in ``hold``

    @property
    def paused(self) -> bool:
        return self.mode is not None

    @property
    def frozen(self) -> int:
        return self._frozen

    def close(self, mode: str) -> None:
        """Enter ``mode`` (also from one pause mode to another: ``abort`` or ``wait`` after ``keep`` thaws)."""
        self.mode = check_mode(mode)
        if self._resumed is None or self._resumed.is_set():
            self._resumed = asyncio.Event()
        if mode == "keep":
            self._thaw.clear()
        else:
            self._thaw.set()

    def open(self) -> None:
        self.mode = None
        self._thaw.set()
        if self._resumed is not None:
            self._resumed.set()

    async def wait_resumed(self) -> None:
        """Return once generation runs again (a new pause meanwhile keeps waiting)."""
        while self.paused and self._resumed is not None:
            await self._resumed.wait()

    def hold(self, lock: _Lock) -> bool:
        """On the decoding thread, between steps: while frozen (``keep``), wait with ``lock`` released.
        Returns whether it waited (the weights may have changed meanwhile)."""
        if self._thaw.is_set():
            return False
        with self._count_lock:
            self._frozen += 1
        lock.release()
        try:
            self._thaw.wait()
        finally:
            with self._count_lock:
                self._frozen -= 1
            lock.acquire()
        return True


def version_spans(spans: list[tuple[int, int]], n_tokens: int) -> list[dict[str, Any]]:
    """vLLM's ``weight_versions``: ``[{"version": "3", "start": 0, "end": k}, ...]`` over ``n_tokens`` output tokens."""
    kept = [(start, v) for start, v in spans if start < n_tokens] or spans[:1]
    ends = [start for start, _ in kept[1:]] + [n_tokens]
    return [{"version": str(v), "start": start, "end": end} for (start, v), end in zip(kept, ends, strict=True)]
