"""``/pause`` and ``/resume`` for the embedded engine (``TransformersChatClient``), with vLLM's modes.

The modes and the gate itself are in ``ludic.inference.weight_sync.pause``; this mixin applies them to the
engine's queue: requests queued in the engine, the batch being decoded, and those held by a pause.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ludic.inference.embedded._generation import RowResult
from ludic.inference.weight_sync.pause import PauseGate, check_mode


class EnginePauseMixin:
    """Pause/resume over the engine's ``_pending`` (queued), ``_running`` (decoding) and ``_held`` requests."""

    gate: PauseGate
    generate_in_thread: bool
    policy_version: int
    _pending: list[Any]
    _running: list[Any]
    _held: int

    async def pause(self, mode: str = "abort") -> int:
        """Hold new requests until ``resume``; abort, wait for, or freeze (``keep``) those in flight.
        Returns how many were in flight. Call it from the loop that serves ``complete``."""
        check_mode(mode)
        if mode == "keep" and not self.generate_in_thread:
            raise ValueError("pause mode 'keep' needs generate_in_thread=True (a frozen batch would block the loop)")
        self.gate.close(mode)
        in_flight = [p for p in self._pending + self._running if not p.future.done()]
        if mode == "abort":
            for p in in_flight:
                p.row.cancelled = True  # a decoding row stops at its next step with finish_reason "abort"
            for p in self._pending:
                p.future.set_result((RowResult(finish_reason="abort"), [(0, self.policy_version)]))
            self._pending.clear()
        while not self._settled(mode, in_flight):
            await asyncio.sleep(0.005)
        return len(in_flight)

    def _settled(self, mode: str, in_flight: list[Any]) -> bool:
        if mode == "keep":  # the decoding batch (if any) waits between two steps
            return not self._running or self.gate.frozen > 0
        return all(p.future.done() for p in in_flight)

    def load(self) -> dict[str, int]:
        """Requests decoding now, queued in the engine, and held by a pause."""
        return {"running": sum(not p.future.done() for p in self._running), "queued": len(self._pending),
                "held": self._held}  # fmt: skip

    def resume(self) -> None:
        """Held requests start, frozen ones continue (with the weights loaded meanwhile)."""
        self.gate.open()
